"""The ownership matrix (issue 18, item 2): for every endpoint that takes an API key, the answer each
kind of caller must get, and proof that one account's records are never visible to or usable by
another.

The table is checked against the URL configuration (`test_every_keyed_endpoint_has_a_row`): a new
keyed endpoint without a row fails, and so does a row whose endpoint is gone.

Callers, for one family (a master with a sub-account and a frozen sub-account) and a stranger (an
unrelated master with a sub-account of its own). The endpoint's *owner* is the master for master
endpoints and for the general ones, the sub-account for the sub-account endpoints; the keys in
`OWNER_KEYS` belong to that owner:

| caller | who |
|---|---|
| `owner` | the owner, with a key of every functional type |
| `master` / `sub` | the family's master and sub-account (one of them is the owner) |
| `unrelated` | the stranger, with a key of every functional type |
| `read_only` | the owner's read-only key |
| `disabled` | the owner's disabled key |
| `outside_ip` | the owner's key restricted to 203.0.113.1, used from 127.0.0.1 |
| `wrong_type` | the owner's key with every functional type but the one the request needs (`Row.needs`) |
| `frozen_sub` | the family's frozen sub-account, with its own key |

The parameters of each row name the family's records (the owner's transfer, quote, listenKey, the
sub-account's e-mail and key), so a caller that is not the owner asks for somebody else's. An
expected answer is `(HTTP status, code)`: the code of the `{code, msg}` envelope, the status of a
refusal in the convert envelope, or None for a success. Every success answered to a caller other
than the owner is checked for the family's marks (e-mails, record ids, keys): none may appear.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
from django.urls import URLPattern

from accounts.models import FUNCTIONAL_KEY_TYPES, ApiKeyType, User
from accounts.services import api_key_set_status, user_set_frozen
from convert import demo as convert_demo
from convert.services import quote_accept, quote_create
from exchange import api_urls
from exchange.api.views import GatewayApi
from streams.services import listen_key_start
from subaccounts.collection import fund_collection_create, fund_collection_run
from tests.support.assertions import assert_ledger_balanced
from tests.support.client import SignedClient
from tests.support.factories import ApiKeyFactory, WhitelistAddressFactory, customer, demo_networks, fund
from wallet.deposits import deposit_address_get, deposit_record
from wallet.selectors import network_get

pytestmark = pytest.mark.django_db

OK = (200, None)
SUB_ONLY = (401, -1152)  # NoPermission: a master's endpoint with a sub-account's key, and the reverse
NOT_YOUR_SUB = (404, -1151)  # an e-mail (or key) that is not one of the caller's sub-accounts'
DISABLED = (401, -2015)
FROZEN = (401, -2015)
OUTSIDE_IP = (401, -2017)
READ_ONLY = (401, -1020)
WRONG_TYPE = (401, -2019)
NOT_FOUND = (404, -1010)
CONVERT_REFUSED = (200, 10000003)
ALLOWED_IP = "203.0.113.1"
CALLERS = ("owner", "master", "sub", "unrelated", "read_only", "disabled", "outside_ip", "wrong_type", "frozen_sub")
OWNER_KEYS = ("read_only", "disabled", "outside_ip", "wrong_type")

_unique = iter(range(10**9))


def unique(prefix: str) -> str:
    return f"{prefix}{time.time_ns() % 10**9}{next(_unique)}"


@dataclass
class World:
    master: object  # tests.support.factories.Customer
    sub: object
    frozen_sub: object
    stranger: object
    stranger_sub: object
    peer: User
    records: dict
    master_marks: set = field(default_factory=set)  # texts of the master's that no other account may see
    family_marks: set = field(default_factory=set)  # the master's and its sub-accounts' texts

    def marks_hidden_from(self, caller: str, row: Row) -> set[str]:
        """What `caller` must not see: the stranger nothing of the family; the sub-account nothing of
        its master's own records on the general endpoints (its master's endpoints refuse it)."""
        if caller == "unrelated":
            return self.family_marks
        if caller == "sub" and row.owner == "any":
            return self.master_marks
        return set()


@dataclass(frozen=True)
class Row:
    """One endpoint: who owns it, what it writes, the key type the request needs, its parameters
    (built from the world for each call, so writes do not collide) and the answers that differ
    from the defaults of `expected()`."""

    owner: str  # "master": a master's endpoint; "sub": a sub-account's; "any": every account's own
    write: bool
    params: Callable[[World], dict]
    needs: str | None = None  # the key type this request needs (declared, or by its asset)
    path: Callable[[World], str] | None = None  # for a path with an argument
    answers: dict = field(default_factory=dict)


def _none(world: World) -> dict:
    return {}


def _transfer(world: World) -> dict:
    return {
        "account": "PHP",
        "amount": "1",
        "target_address": world.peer.email,
        "client_transfer_id": unique("ct"),
    }


def _universal(world: World) -> dict:
    return {"toEmail": world.sub.user.email, "asset": "BTC", "amount": "0.01", "clientTranId": unique("ut")}


def _ip_record(world: World) -> dict:
    return {"email": world.sub.user.email, "apikey": world.records["sub_key"]}


# Keyed by "<METHOD> <route>" as the URL configuration spells it (exchange/api_urls.py).
TABLE: dict[str, Row] = {
    # accounts
    "GET v1/api-keys": Row("any", False, _none),
    "GET v1/account": Row("any", False, _none),
    "GET account/v3/crypto-accounts": Row("any", False, _none),
    "GET v1/asset/transaction/history": Row(
        "any",
        False,
        lambda w: {"tokenId": "BTC", "subUserId": w.sub.user.pk},
        answers={"sub": SUB_ONLY, "unrelated": SUB_ONLY},  # subUserId: a sub-account of the caller only
    ),
    # streams
    "POST v1/userDataStream": Row("any", False, _none),
    "PUT v1/userDataStream": Row(
        "any",
        False,
        lambda w: {"listenKey": w.records["listen_key"]},
        answers={"sub": (400, -1125), "unrelated": (400, -1125)},  # another account's listenKey: unknown
    ),
    "DELETE v1/userDataStream": Row(
        "any",
        False,
        # A listenKey of the master's for each call: any key of the account may close it.
        lambda w: {"listenKey": listen_key_start(account=w.master.user, api_key=w.master.api_key.key)},
        answers={"sub": (400, -1125), "unrelated": (400, -1125)},
    ),
    # wallet
    "GET wallet/v1/config/getall": Row("any", False, _none),
    "GET wallet/v1/deposit/address": Row("any", False, lambda w: {"coin": "BTC", "network": "BTC"}),
    "POST wallet/v1/withdraw/apply": Row(
        "any",
        True,
        lambda w: {
            "coin": "BTC",
            "network": "BTC",
            "address": w.records["whitelisted"],
            "amount": "0.01",
            "withdrawOrderId": unique("wo"),
        },
        needs=ApiKeyType.CRYPTO_WALLET,
        # The address is on the master's whitelist only: anyone else's withdrawal to it is refused
        # (docs/wallet.md: not in the caller's whitelist, -1025).
        answers={"sub": (400, -1025), "unrelated": (400, -1025)},
    ),
    "GET wallet/v1/deposit/history": Row("any", False, lambda w: {"txId": w.records["deposit_tx"]}),
    "GET wallet/v1/withdraw/history": Row("any", False, lambda w: {"withdrawOrderId": w.records["withdraw_order"]}),
    "GET wallet/v1/withdraw/address-whitelist": Row("any", False, _none),
    "POST transfer/v4/transfers": Row("any", True, _transfer, needs=ApiKeyType.FIAT),
    "GET transfer/v3/transfers": Row("any", False, lambda w: {"client_transfer_id": w.records["transfer_ctid"]}),
    "POST transfer/v3/transfers": Row("any", True, _transfer, needs=ApiKeyType.FIAT),
    "GET transfer/v3/transfers/<str:transfer_id>": Row(
        "any",
        False,
        _none,
        path=lambda w: f"/openapi/transfer/v3/transfers/{w.records['transfer_id']}",
        answers={"sub": NOT_FOUND, "unrelated": NOT_FOUND},
    ),
    # convert
    "POST convert/v1/get-supported-trading-pairs": Row("any", True, _none, needs=ApiKeyType.CONVERT),
    "POST convert/v1/get-quote": Row(
        "any",
        True,
        lambda w: {"sourceCurrency": "BTC", "targetCurrency": "PHP", "sourceAmount": "0.001"},
        needs=ApiKeyType.CONVERT,
    ),
    "POST convert/v1/accept-quote": Row(
        "any",
        True,
        lambda w: {"quoteId": w.records["quote"]},
        needs=ApiKeyType.CONVERT,
        answers={"sub": CONVERT_REFUSED, "unrelated": CONVERT_REFUSED},  # not their quote: not found
    ),
    "POST convert/v1/query-order-history": Row("any", False, _none),
    # sub-accounts: the master's endpoints
    "GET v1/sub-account/list": Row("master", False, _none, answers={"unrelated": OK}),
    "POST v1/sub-account/create": Row(
        "master", True, lambda w: {"accountName": f"{unique('new')}@test.example"}, answers={"unrelated": OK}
    ),
    "GET v1/sub-account/asset": Row("master", False, lambda w: {"email": w.sub.user.email}),
    "POST v1/sub-account/transfer/universal-transfer": Row("master", True, _universal, needs=ApiKeyType.CRYPTO_WALLET),
    "GET v1/sub-account/transfer/universal-transfer-history": Row(
        "master", False, lambda w: {"fromEmail": w.sub.user.email}
    ),
    "GET v1/sub-account/apikey/ip-restriction": Row("master", False, _ip_record),
    "POST v1/sub-account/apikey/add-ip-restriction": Row(
        "master",
        True,
        lambda w: {**_ip_record(w), "ipAddress": "198.51.100.7", "ipRestriction": "2"},
        needs=ApiKeyType.ACCOUNT,
    ),
    "POST v1/sub-account/apikey/delete-ip-restriction": Row(
        "master", True, lambda w: {**_ip_record(w), "ipAddress": "198.51.100.99"}, needs=ApiKeyType.ACCOUNT
    ),
    "GET v1/sub-account/wallet/deposit/address": Row(
        "master", False, lambda w: {"email": w.sub.user.email, "coin": "BTC", "network": "BTC"}
    ),
    "GET v1/sub-account/wallet/deposit/history": Row("master", False, lambda w: {"email": w.sub.user.email}),
    "POST v1/fund-collect/collect-from-sub-account": Row(
        "master",
        True,
        lambda w: {"clientRequestId": unique("fc")},
        needs=ApiKeyType.CRYPTO_WALLET,
        answers={"unrelated": OK},  # its own family's collection
    ),
    "GET v1/fund-collect/get-fund-record": Row(
        "master", False, lambda w: {"clientRequestId": w.records["collection"]}, answers={"unrelated": OK}
    ),
    # sub-accounts: the sub-account's endpoints
    "POST v1/sub-account/transfer/sub-to-master": Row(
        "sub",
        True,
        lambda w: {"asset": "BTC", "amount": "0.01", "clientTranId": unique("sm")},
        needs=ApiKeyType.CRYPTO_WALLET,
    ),
    "GET v1/sub-account/transfer/sub-history": Row("sub", False, lambda w: {"type": "1"}),
}


def keyed_endpoints() -> dict[str, type[GatewayApi]]:
    """Every (method, route) of /openapi/ whose view takes an API key, from the URL configuration."""
    found = {}
    for pattern in api_urls.urlpatterns:
        assert isinstance(pattern, URLPattern), pattern  # the apps' routes are spliced in flat
        view = getattr(pattern.callback, "view_class", None)
        if view is None or not issubclass(view, GatewayApi) or not view.security.needs_key:
            continue
        for method in view.http_method_names:
            if method != "head" and hasattr(view, method):
                found[f"{method.upper()} {pattern.pattern}"] = view
    return found


def test_every_keyed_endpoint_has_a_row():
    endpoints = keyed_endpoints()
    missing = sorted(set(endpoints) - set(TABLE))
    assert not missing, f"keyed endpoints without a row in the ownership matrix: {missing}"
    gone = sorted(set(TABLE) - set(endpoints))
    assert not gone, f"rows for endpoints that no longer exist: {gone}"


def test_the_table_agrees_with_the_declarations():
    """What the rows say about writes and declared key types is what the views declare."""
    endpoints = keyed_endpoints()
    for name, view in endpoints.items():
        method = name.split(" ", 1)[0]
        row = TABLE[name]
        declared_write = method not in ("GET", "HEAD") if view.is_write is None else view.is_write
        assert row.write == declared_write, name
        if view.key_type is not None:
            assert row.needs == view.key_type, name


def expected(row: Row, caller: str) -> tuple[int, int | None]:
    if caller in row.answers:
        return row.answers[caller]
    if caller == "disabled":
        return DISABLED
    if caller == "frozen_sub":
        return FROZEN
    if caller == "outside_ip":
        return OUTSIDE_IP
    if caller == "read_only":
        return READ_ONLY if row.write else OK
    if caller == "wrong_type":
        return WRONG_TYPE if row.needs else OK
    if caller == "owner":
        return OK
    if row.owner == "any":  # master, sub, unrelated: each reads and writes its own
        return OK
    if row.owner == "master":
        return {"master": OK, "sub": SUB_ONLY, "unrelated": NOT_YOUR_SUB}[caller]
    return {"sub": OK, "master": SUB_ONLY, "unrelated": SUB_ONLY}[caller]


def _key_of(user: User, *, types=None, ip_list=None, ip_restrict=None) -> SignedClient:
    return SignedClient.of(ApiKeyFactory(user=user, types=types, ip_list=ip_list, ip_restrict=ip_restrict))


def caller_client(world: World, row: Row, caller: str) -> SignedClient:
    owner = world.sub if row.owner == "sub" else world.master
    if caller == "owner":
        return owner.client
    if caller in ("master", "sub", "unrelated", "frozen_sub"):
        return {"master": world.master, "sub": world.sub, "unrelated": world.stranger, "frozen_sub": world.frozen_sub}[
            caller
        ].client
    if caller == "read_only":
        return _key_of(owner.user, types=[ApiKeyType.READ_ONLY])
    if caller == "disabled":
        created = ApiKeyFactory(user=owner.user)
        api_key_set_status(api_key=created[0], enabled=False)
        return SignedClient.of(created)
    if caller == "outside_ip":
        return _key_of(owner.user, ip_list=[ALLOWED_IP], ip_restrict=True)  # the client calls from 127.0.0.1
    assert caller == "wrong_type"
    types = [t for t in FUNCTIONAL_KEY_TYPES if t != row.needs] if row.needs else [ApiKeyType.SPOT]
    return _key_of(owner.user, types=types)


@pytest.fixture
def world(db, settings) -> World:
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**9
    settings.CONVERT_QUOTE_INTERVAL_MS = 0
    networks = demo_networks()
    master = customer(email="own-master@test.example", funding={"BTC": "10", "PHP": "10000"})
    sub = customer(email="own-sub@test.example", master=master.user, is_virtual=True)
    frozen_sub = customer(email="own-frozen@test.example", master=master.user, is_virtual=True)
    user_set_frozen(user=frozen_sub.user, frozen=True)
    stranger = customer(email="stranger@test.example", funding={"BTC": "10", "PHP": "10000"})
    stranger_sub = customer(email="stranger-sub@test.example", master=stranger.user, is_virtual=True)
    peer = customer(email="peer@test.example").user
    for network in networks:
        WhitelistAddressFactory(account=master.user, network=network)
    convert_demo.load()
    records = _records(master, sub)
    fund(sub.user, "BTC", "1")  # after the family's collection (in _records) took its balances
    fund(sub.user, "PHP", "100")
    master_marks = {
        master.user.email,
        master.api_key.key,
        # Ids that are numbers could be any number in a body: the texts only (client ids, quote
        # ids, the listenKey, the deposit address).
        *(
            str(value)
            for name, value in records.items()
            if name not in ("whitelisted", "sub_key") and not str(value).isdigit()
        ),
    }
    family_marks = master_marks | {sub.user.email, frozen_sub.user.email, sub.api_key.key, records["sub_key"]}
    return World(master, sub, frozen_sub, stranger, stranger_sub, peer, records, master_marks, family_marks)


def _records(master, sub) -> dict:
    """One record of every kind for the family, made through the API and the services."""
    transfer = master.client.post(
        "/openapi/transfer/v4/transfers",
        {"account": "PHP", "amount": "5", "target_address": "peer@test.example", "client_transfer_id": "own-ct-1"},
    ).json()
    withdrawal = master.client.post(
        "/openapi/wallet/v1/withdraw/apply",
        {
            "coin": "BTC",
            "network": "BTC",
            "address": "bc1qdemo0master0whitelist0address0000000",
            "amount": "0.01",
            "withdrawOrderId": "own-wo-1",
        },
    )
    assert withdrawal.status_code == 200, withdrawal.content
    address = deposit_address_get(account=master.user, coin="BTC", network="BTC")
    deposit_record(
        network=network_get(coin="BTC", network="BTC"),
        tx_id="own-deposit-tx-1",
        output_index=0,
        address=address.address,
        tag=address.tag,
        amount=Decimal("0.5"),
        confirmations=100,
    )
    order_quote = quote_create(user=master.user, source_code="BTC", target_code="PHP", source_amount=Decimal("0.001"))
    order = quote_accept(user=master.user, quote_id=order_quote.quote_id)
    quote = quote_create(user=master.user, source_code="BTC", target_code="PHP", source_amount=Decimal("0.002"))
    collection = fund_collection_create(master=master.user, client_request_id="own-fc-1")
    fund_collection_run(collection_id=collection.pk)  # settled: the master may start another
    sub_key, _ = ApiKeyFactory(user=sub.user, ip_list=["198.51.100.99"], ip_restrict=False)
    return {
        "transfer_id": transfer["transfer"]["id"],
        "transfer_ctid": "own-ct-1",
        "withdraw_order": "own-wo-1",
        "withdrawal_id": withdrawal.json()["id"],
        "deposit_tx": "own-deposit-tx-1",
        "deposit_address": address.address,
        "quote": quote.quote_id,
        "order_quote": order_quote.quote_id,
        "order": order.pk,
        "collection": collection.client_request_id,
        "listen_key": listen_key_start(account=master.user, api_key=master.api_key.key),
        "sub_key": sub_key.key,
        "whitelisted": "bc1qdemo0master0whitelist0address0000000",
    }


def answer(response) -> tuple[int, int | None]:
    body = response.json()
    if response.status_code >= 400:
        assert set(body) == {"code", "msg"}, body
        return response.status_code, body["code"]
    if isinstance(body, dict) and set(body) >= {"status", "error", "data"} and body["status"] != 0:
        return response.status_code, body["status"]
    return response.status_code, None


def _leaks(marks: set[str], response) -> set[str]:
    text = response.content.decode()
    return {mark for mark in marks if mark in text}


# Callers other than the owner go first: the owner's own write (closing its listenKey, accepting
# its quote) must not hide what the others were refused.
ORDER = ("master", "sub", "unrelated", "read_only", "disabled", "outside_ip", "wrong_type", "frozen_sub", "owner")


@pytest.mark.parametrize("endpoint", sorted(TABLE))
def test_the_matrix(world, endpoint):
    row = TABLE[endpoint]
    method, route = endpoint.split(" ", 1)
    path = row.path(world) if row.path else f"/openapi/{route}"
    owner = "sub" if row.owner == "sub" else "master"
    wrong = []
    for caller in ORDER:
        if caller == owner:
            continue  # the owner itself: asked last, as `owner`
        response = caller_client(world, row, caller).request(method, path, row.params(world))
        got, want = answer(response), expected(row, caller)
        leaked = _leaks(world.marks_hidden_from(caller, row), response) if got[0] < 300 else set()
        if got != want:
            wrong.append(f"{caller}: got {got} {response.content[:160]!r}, expected {want}")
        elif leaked:
            wrong.append(f"{caller}: the family's {sorted(leaked)} in {response.content[:300]!r}")
    assert not wrong, f"{endpoint}:\n" + "\n".join(wrong)
    assert_ledger_balanced()


# --- records of one account, used by another ------------------------------------------------------


def test_a_transfer_is_seen_by_its_two_parties_only(world):
    transfer_id = world.records["transfer_id"]
    path = f"/openapi/transfer/v3/transfers/{transfer_id}"
    assert world.master.client.get(path).status_code == 200
    assert SignedClient.of(ApiKeyFactory(user=world.peer)).get(path).status_code == 200  # its recipient
    for other in (world.sub, world.stranger, world.stranger_sub):
        assert answer(other.client.get(path)) == NOT_FOUND
        for params in ({"id": transfer_id}, {"client_transfer_id": "own-ct-1"}):
            listed = other.client.get("/openapi/transfer/v3/transfers", params)
            assert listed.status_code in (200, 404), listed.content
            assert not _leaks(world.master_marks, listed) or listed.status_code == 404, listed.content


def test_withdrawals_and_deposits_are_the_owners_only(world):
    for other in (world.sub, world.stranger):
        withdrawals = other.client.get("/openapi/wallet/v1/withdraw/history", {"withdrawOrderId": "own-wo-1"})
        assert withdrawals.json() == [], withdrawals.content
        deposits = other.client.get("/openapi/wallet/v1/deposit/history", {"txId": "own-deposit-tx-1"})
        assert deposits.json() == [], deposits.content
        everything = other.client.get("/openapi/wallet/v1/deposit/history")
        assert everything.status_code == 200
        assert not _leaks(world.master_marks, everything)
    # The stranger asking for the family's sub-account's deposits by e-mail: not its sub-account.
    refused = world.stranger.client.get(
        "/openapi/v1/sub-account/wallet/deposit/history", {"email": world.sub.user.email}
    )
    assert answer(refused) == NOT_YOUR_SUB
    mine = world.master.client.get("/openapi/wallet/v1/withdraw/history", {"withdrawOrderId": "own-wo-1"}).json()
    assert [row["withdrawOrderId"] for row in mine] == ["own-wo-1"]


def test_a_quote_cannot_be_accepted_by_another_account(world):
    quote = world.records["quote"]
    for other in (world.sub, world.stranger):
        refused = other.client.post("/openapi/convert/v1/accept-quote", {"quoteId": quote})
        assert answer(refused) == CONVERT_REFUSED
    accepted = world.master.client.post("/openapi/convert/v1/accept-quote", {"quoteId": quote})
    assert answer(accepted) == OK, accepted.content  # untouched by the others' attempts
    history = world.stranger.client.post("/openapi/convert/v1/query-order-history").json()
    assert history["data"] == [], history
    assert_ledger_balanced()


def test_collection_tasks_are_per_master(world):
    records = world.stranger.client.get("/openapi/v1/fund-collect/get-fund-record", {"clientRequestId": "own-fc-1"})
    assert records.json() == [], records.content
    # The same clientRequestId is the stranger's own, unrelated task: the family's is not touched.
    mine = world.stranger.client.post(
        "/openapi/v1/fund-collect/collect-from-sub-account", {"clientRequestId": "own-fc-1"}
    )
    assert mine.status_code == 200, mine.content
    family = world.master.client.get("/openapi/v1/fund-collect/get-fund-record").json()
    assert [row["clientRequestId"] for row in family] == ["own-fc-1"]


def test_a_listen_key_is_its_accounts_only(world):
    key = world.records["listen_key"]
    for other in (world.sub, world.stranger):
        for method in ("PUT", "DELETE"):
            assert answer(other.client.request(method, "/openapi/v1/userDataStream", {"listenKey": key})) == (
                400,
                -1125,
            )
    # Still the master's, still open.
    assert world.master.client.put("/openapi/v1/userDataStream", {"listenKey": key}).status_code == 200


def test_ip_restrictions_of_another_familys_key_are_out_of_reach(world):
    sub_key = world.records["sub_key"]
    stranger_sub_key, _ = ApiKeyFactory(user=world.stranger_sub.user)
    asks = [
        # the stranger naming the family's sub-account
        (world.stranger, {"email": world.sub.user.email, "apikey": sub_key}),
        # the stranger naming its own sub-account with the family's key
        (world.stranger, {"email": world.stranger_sub.user.email, "apikey": sub_key}),
        # the master naming its own sub-account with the stranger's sub-account's key
        (world.master, {"email": world.sub.user.email, "apikey": stranger_sub_key.key}),
        # the master naming its sub-account with its own key
        (world.master, {"email": world.sub.user.email, "apikey": world.master.api_key.key}),
    ]
    for caller, params in asks:
        assert answer(caller.client.get("/openapi/v1/sub-account/apikey/ip-restriction", params)) == NOT_YOUR_SUB
        added = caller.client.post(
            "/openapi/v1/sub-account/apikey/add-ip-restriction",
            {**params, "ipAddress": "192.0.2.66", "ipRestriction": "1"},
        )
        assert answer(added) == NOT_YOUR_SUB
        deleted = caller.client.post(
            "/openapi/v1/sub-account/apikey/delete-ip-restriction", {**params, "ipAddress": "198.51.100.99"}
        )
        assert answer(deleted) == NOT_YOUR_SUB
    record = world.master.client.get(
        "/openapi/v1/sub-account/apikey/ip-restriction", {"email": world.sub.user.email, "apikey": sub_key}
    ).json()
    assert record["ipList"] == ["198.51.100.99"], record  # nothing the others sent changed it
    assert record["ipRestrict"] is False


def test_a_sub_accounts_history_and_balances_stay_in_its_family(world):
    for path, params in (
        ("/openapi/v1/sub-account/asset", {"email": world.sub.user.email}),
        ("/openapi/v1/sub-account/transfer/universal-transfer-history", {"toEmail": world.sub.user.email}),
        ("/openapi/v1/asset/transaction/history", {"tokenId": "BTC", "subUserId": world.sub.user.pk}),
    ):
        refused = world.stranger.client.get(path, params)
        assert answer(refused) in (NOT_YOUR_SUB, SUB_ONLY), (path, refused.content)
    listed = world.stranger.client.get("/openapi/v1/sub-account/list").json()
    assert [row["email"] for row in listed["subAccounts"]] == [world.stranger_sub.user.email]
    assert json.dumps(listed).count("own-") == 0


def test_a_frozen_sub_account_neither_sends_nor_receives_in_its_family(world):
    fund(world.frozen_sub.user, "BTC", "1")
    universal = "/openapi/v1/sub-account/transfer/universal-transfer"
    for params in ({"fromEmail": world.frozen_sub.user.email}, {"toEmail": world.frozen_sub.user.email}):
        refused = world.master.client.post(universal, {**params, "asset": "BTC", "amount": "0.1"})
        assert answer(refused) == SUB_ONLY, refused.content
    # Its master still sees it (docs/subaccounts.md: isFreeze, its balances, its deposit address).
    assets = world.master.client.get("/openapi/v1/sub-account/asset", {"email": world.frozen_sub.user.email})
    assert assets.status_code == 200, assets.content
    assert_ledger_balanced()
