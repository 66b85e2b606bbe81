"""Schema-driven fuzzing (issue 18, item 1): Schemathesis generates requests for every operation of
the service's own OpenAPI document (/openapi/schema, loaded from the app), each one is signed the
way the official connector signs (fresh timestamp, HMAC-SHA256 over totalParams) and sent with its
parameters in the query string or in a form body, and every answer must be:

- never a 5xx;
- an error: the `{code, msg}` envelope with a negative code (or, on the convert endpoints, the
  convert envelope `{status != 0, error, data: null}`, HTTP 200: docs/convert.md);
- a success: a body that matches the operation's response schema (Schemathesis'
  response_schema_conformance), with the status and content type the document declares.

Three generation modes per operation: `positive` (values that fit the declared types), `negative`
(values that do not, the signing parameters included) and `informed` (the operation's parameters
that name something of the caller's world, such as an asset, a sub-account's e-mail or a
whitelisted address, a transfer's id, are set to real values, the rest generated), so that the
fuzzer also reaches the code behind the parameter checks: each informed case must see at least one
of its requests succeed. Examples are derandomized: the same code generates the same
requests. The number of requests per operation is printed at the end of the module.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from decimal import Decimal
from urllib.parse import quote, urlencode

import pytest
import requests
import schemathesis
from django.test import Client
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from accounts.models import ApiKeyType
from convert import demo as convert_demo
from convert.services import quote_create
from exchange.api.auth import API_KEY_HEADER
from exchange.api.schema import openapi_document
from exchange.wsgi import application
from streams.services import listen_key_start
from tests.support.client import FORM, hmac_hex, now_ms
from tests.support.factories import (
    ApiKeyFactory,
    UserFactory,
    WhitelistAddressFactory,
    customer,
    demo_networks,
    fund,
)
from tests.support.params import plausible_params
from wallet.transfers.services import transfer_create

pytestmark = pytest.mark.django_db

SCHEMA_URL = "/openapi/schema?format=json"
# Examples per operation, mode and placement: 15 + 10 + 10 (about 3,300 requests) keep the module
# near half a minute on the test machine; FUZZ_EXAMPLES multiplies them for a longer local run
# (`FUZZ_EXAMPLES=10 pytest tests/fuzz`). Derandomized: the same requests every run.
_SCALE = float(os.environ.get("FUZZ_EXAMPLES") or 1)
EXAMPLES = {
    mode: max(1, round(count * _SCALE))
    for mode, count in {GenerationMode.POSITIVE: 15, GenerationMode.NEGATIVE: 10, "informed": 10}.items()
}
CONVERT_PREFIX = "/openapi/convert/"
SUB_ACCOUNT_ONLY = {"/openapi/v1/sub-account/transfer/sub-to-master", "/openapi/v1/sub-account/transfer/sub-history"}
# The parameters the `informed` mode sets to values of the test's world (the `world` fixture).
KNOWN_NAMES = {
    *("recvWindow", "email", "fromEmail", "toEmail", "accountName", "asset", "coin", "network", "currency"),
    *("tokenId", "account", "amount", "target_address", "address", "sourceCurrency", "targetCurrency"),
    *("sourceAmount", "apikey", "ipAddress", "ipRestriction", "page", "size", "limit", "startTime", "endTime"),
    *("quoteId", "listenKey", "transfer_id"),
}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _operations() -> dict[tuple[str, str], set[str]]:
    """Every (method, path) of the document the app serves (generated from its routes at import),
    with the names of its parameters."""
    return {
        (method.upper(), path): {parameter["name"] for parameter in operation.get("parameters", [])}
        for path, operations in openapi_document()["paths"].items()
        for method, operation in operations.items()
        if method in ("get", "post", "put", "delete")
    }


PARAMETERS = _operations()
OPERATIONS = sorted(PARAMETERS)
# (method, path) -> mode -> placement -> requests sent; and statuses seen per operation.
REQUESTS: dict[tuple[str, str], Counter] = defaultdict(Counter)
STATUSES: dict[tuple[str, str], Counter] = defaultdict(Counter)


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    """The document as /openapi/schema serves it (a request to the app through its WSGI handler,
    outside any test's transaction: the handler's request signals check the connection)."""
    with django_db_blocker.unblock():
        return schemathesis.openapi.from_wsgi(SCHEMA_URL, application)


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    yield
    if not REQUESTS:
        return
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    lines = ["", "fuzzed requests per operation (mode/placement: count; status:code seen)"]
    total = 0
    for operation in sorted(REQUESTS):
        counts = REQUESTS[operation]
        total += sum(counts.values())
        modes = ", ".join(f"{key}: {value}" for key, value in sorted(counts.items()))
        statuses = ", ".join(f"{outcome} x{n}" for outcome, n in sorted(STATUSES[operation].items()))
        lines.append(f"  {operation[0]:6} {operation[1]}: {sum(counts.values())} ({modes}; {statuses})")
    lines.append(f"  total: {total} requests over {len(REQUESTS)} operations")
    with capture.global_and_fixture_disabled():
        for line in lines:
            reporter.write_line(line)


@pytest.fixture
def world(db, settings):
    """A master account with funds, a whitelist, two sub-accounts and a peer; convert pairs."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**9  # never banned
    settings.LISTEN_KEY_CREATE_LIMIT_PER_HOUR = 10**6
    settings.CONVERT_QUOTE_INTERVAL_MS = 0
    networks = demo_networks()
    master = customer(email="fuzz-master@test.example", funding={"BTC": "100", "PHP": "100000", "USDT": "10000"})
    sub = customer(email="fuzz-sub1@test.example", master=master.user, is_virtual=True, funding={"BTC": "1"})
    customer(email="fuzz-sub2@test.example", master=master.user, is_virtual=True)
    peer = UserFactory(email="fuzz-peer@test.example")
    fund(peer, "PHP", "1")
    for network in networks:
        WhitelistAddressFactory(account=master.user, network=network)
    convert_demo.load()
    sub_key, _ = ApiKeyFactory(user=sub.user, types=[ApiKeyType.READ_ONLY])
    known = plausible_params(
        sub_email=sub.user.email,
        sub_api_key=sub_key.key,
        peer_email=peer.email,
        to_email="fuzz-sub2@test.example",
        new_sub_email="fuzz-new-sub@test.example",
    ) | {
        "recvWindow": 5000,
        "quoteId": quote_create(
            user=master.user, source_code="BTC", target_code="PHP", source_amount=Decimal("0.001")
        ).quote_id,
        "listenKey": listen_key_start(account=master.user, api_key=master.api_key.key),
        "transfer_id": str(
            transfer_create(sender=master.user, asset_code="PHP", target_address=peer.email, amount=Decimal(1)).pk
        ),
        "page": 1,
        "size": 10,
        "limit": 10,
        "startTime": now_ms() - 86_400_000,
        "endTime": now_ms() + 60_000,
    }
    assert set(known) == KNOWN_NAMES
    return {"master": master, "sub": sub, "known": known}


def _signed_text(case, placement: str, mode) -> tuple[str, str]:
    """(query, body) of the case, signed like the official connector: the generated parameters in
    the order generated, a fresh `timestamp`, `signature` = HMAC-SHA256 of query + body."""
    params = {name: value for name, value in (case.query or {}).items() if name not in ("timestamp", "signature")}
    if mode is not GenerationMode.NEGATIVE:
        # Valid modes fuzz the endpoint, not the signing parameters (tests/exchange covers those):
        # a generated recvWindow outside 1..60000 would stop every request at the gateway.
        window = params.pop("recvWindow", None)
        if isinstance(window, int) and 0 < window <= 60_000:
            params["recvWindow"] = window
    params = {name: _text(value) for name, value in params.items()}
    params["timestamp"] = str(now_ms())
    pairs = urlencode(params)
    query, body = (pairs, "") if placement == "query" else ("", pairs)
    return query, body


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def _send(client: Client, case, caller, placement: str, mode) -> Response:
    query, body = _signed_text(case, placement, mode)
    signed = case.operation.schema.raw_schema["paths"][case.operation.path][case.method.lower()].get("security")
    if signed:
        query = query + ("&" if query else "") + f"signature={hmac_hex(caller.secret, query + body)}"
    path = case.operation.path
    for name, value in (case.path_parameters or {}).items():
        path = path.replace("{" + name + "}", quote(_text(value), safe=""))
    url = f"{path}?{query}" if query else path
    started = time.monotonic()
    answer = client.generic(
        case.method.upper(),
        url,
        data=body,
        content_type=FORM,
        headers={API_KEY_HEADER: caller.api_key.key},
        REMOTE_ADDR="127.0.0.1",
    )
    elapsed = time.monotonic() - started
    prepared = requests.Request(
        method=case.method.upper(),
        url=f"http://testserver{url}",
        headers={API_KEY_HEADER: caller.api_key.key, "Content-Type": FORM},
        data=body,
    ).prepare()
    return Response(
        status_code=answer.status_code,
        headers={name.lower(): [value] for name, value in answer.headers.items()},
        content=answer.content,
        request=prepared,
        elapsed=elapsed,
        verify=False,
    )


def _outcome(response: Response) -> str:
    """`200`, `400:-1025` (an error's code), `200:10000003` (a refusal in the convert envelope)."""
    try:
        body = json.loads(response.content)
    except ValueError:
        return str(response.status_code)
    if isinstance(body, dict) and "code" in body and response.status_code >= 400:
        return f"{response.status_code}:{body['code']}"
    if (
        response.request.url.startswith(f"http://testserver{CONVERT_PREFIX}")
        and isinstance(body, dict)
        and body.get("status")
    ):
        return f"{response.status_code}:{body['status']}"
    return str(response.status_code)


def assert_envelope(path: str, response: Response) -> None:
    """Every refusal is `{code < 0, msg}`; a convert endpoint may refuse in the convert envelope."""
    assert response.status_code < 500, (response.status_code, response.content)
    body = json.loads(response.content)
    if response.status_code >= 400:
        assert set(body) == {"code", "msg"}, body
        assert isinstance(body["code"], int), body
        assert body["code"] < 0, body
        assert isinstance(body["msg"], str), body
        assert body["msg"], body
    elif path.startswith(CONVERT_PREFIX):
        assert {"status", "error", "data"} <= set(body) <= {"status", "error", "data", "total"}, body
        if body["status"] != 0:
            assert body["status"] > 0, body
            assert body["data"] is None, body
            assert isinstance(body["error"], str), body
            assert body["error"], body
        else:
            assert body["error"] == "OK", body


# Where one operation needs another value than the others (None: not set, generated): a withdrawal
# of 1 BTC is over the account's limits (-1010), so the informed withdrawals would never reach the
# wallet; the universal-transfer history refuses fromEmail with toEmail (-1107).
KNOWN_FOR = {
    "/openapi/wallet/v1/withdraw/apply": {"amount": "0.01"},
    "/openapi/v1/sub-account/transfer/universal-transfer-history": {"toEmail": None},
}


def _strategy(operation, mode, known: dict):
    if mode == "informed":
        values = {**known, **KNOWN_FOR.get(operation.path, {})}
        chosen = {}
        for place, parameters in (("query", operation.query), ("path_parameters", operation.path_parameters)):
            names = {parameter.name for parameter in parameters}
            chosen[place] = {k: v for k, v in values.items() if k in names and v is not None} or None
        return operation.as_strategy(GenerationMode.POSITIVE, **chosen)
    return operation.as_strategy(mode)


def _succeeded(outcome: str) -> bool:
    """A success: 2xx with no refusal code (the convert envelope's status 0 included)."""
    return ":" not in outcome and outcome.startswith("2")


MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE, "informed"]


def _placements(method: str) -> list[str]:
    return ["query"] if method == "GET" else ["query", "body"]


def _modes(operation: tuple[str, str]) -> list:
    """Without parameters there is nothing to get wrong; `informed` only where it sets something."""
    names = PARAMETERS[operation]
    if not names:
        return [GenerationMode.POSITIVE]
    return [mode for mode in MODES if mode != "informed" or names & set(KNOWN_NAMES)]


CASES = [
    pytest.param(method, path, mode, placement, id=f"{method} {path} {getattr(mode, 'value', mode)} {placement}")
    for method, path in OPERATIONS
    for mode in _modes((method, path))
    for placement in _placements(method)
]


def test_the_fuzzer_covers_every_operation_of_the_document(schema):
    """The list parametrizing the tests is the document the app serves: nothing is left out."""
    served = sorted(
        (operation.method.upper(), operation.path)
        for result in schema.get_all_operations()
        for operation in [result.ok()]
    )
    assert served == OPERATIONS
    assert len(OPERATIONS) >= 37


@pytest.mark.parametrize(("method", "path", "mode", "placement"), CASES)
def test_fuzz(schema, world, method, path, mode, placement):
    operation = schema[path][method]
    caller = world["sub"] if path in SUB_ACCOUNT_ONLY else world["master"]
    client = Client()
    key = (method, path)
    outcomes: Counter = Counter()

    @settings(
        max_examples=EXAMPLES[mode],
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=_strategy(operation, mode, world["known"]))
    def run(case):
        response = _send(client, case, caller, placement, mode)
        REQUESTS[key][f"{getattr(mode, 'value', mode)}/{placement}"] += 1
        outcomes[_outcome(response)] += 1
        STATUSES[key][_outcome(response)] += 1
        assert_envelope(path, response)
        case.validate_response(response, checks=CHECKS)

    run()
    if mode == "informed":
        # The mode exists to reach the code behind the parameter checks: at least one of its
        # requests must go all the way and succeed, or its real values no longer fit the operation.
        assert any(_succeeded(outcome) for outcome in outcomes), f"no informed request succeeded: {dict(outcomes)}"
