"""Secrets stay secret (issue 18, item 5): a broad slice of HTTP traffic (a signed request to every
operation of the OpenAPI document, in the query string and in a form body; failing signatures,
stale timestamps, unknown keys, replays; a server error; a key created, listed, disabled and
enabled in the admin) runs with every logger at DEBUG (the project's, django, django.request,
django.db.backends with the SQL and its parameters, the root) and stdout/stderr captured. No API
secret (the HMAC key of every signature), no Fernet key (accounts/crypto.py, from
API_SECRET_ENCRYPTION_KEYS or derived from SECRET_KEY) and not SECRET_KEY may appear, whole or as
any 16 characters of it, in a log line, in captured output, in any response (error messages
included), or in an admin page other than the key's creation page.

`test_the_scanner_finds_a_planted_secret` plants a canary in each place and shows the scan finds it.
"""

from __future__ import annotations

import base64
import logging
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.urls import reverse

from accounts.models import ApiKey, ApiKeyType, User
from convert import demo as convert_demo
from exchange.api.schema import openapi_document
from tests.support.client import FORM, SignedClient, hmac_hex, now_ms
from tests.support.factories import ApiKeyFactory, WhitelistAddressFactory, customer, demo_networks
from tests.support.params import plausible_params
from tests.support.staff import logged_in

pytestmark = pytest.mark.django_db

WINDOW = 16  # any 16 characters of a secret count as the secret
LOGGERS = (
    "",
    "django",
    "django.request",
    "django.server",
    "django.security",
    "django.db.backends",
    "django.template",
    *("accounts", "wallet", "exchange", "convert", "subaccounts", "streams", "celery"),
)
SECRET_RE = re.compile(r'<code id="secret-key">([^<]+)</code>')
KEY_RE = re.compile(r'<code id="api-key">([^<]+)</code>')


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # the message, its arguments and any traceback


@contextmanager
def everything_logged():
    """Every logger at DEBUG into one handler on the root logger; SQL logged with its parameters."""
    handler = Capture()
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    disabled = {name: logging.getLogger(name).disabled for name in LOGGERS}
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
        logging.getLogger(name).disabled = False
    root = logging.getLogger()
    root.addHandler(handler)
    forced = connection.force_debug_cursor
    connection.force_debug_cursor = True  # django.db.backends logs each query, as with DEBUG on
    try:
        yield handler
    finally:
        connection.force_debug_cursor = forced
        root.removeHandler(handler)
        for name in LOGGERS:
            logging.getLogger(name).setLevel(levels[name])
            logging.getLogger(name).disabled = disabled[name]


@dataclass
class Exposure:
    """Where texts were seen (`where` -> text) and the secrets to look for (`name` -> secret)."""

    secrets: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    count: int = 0

    def see(self, where: str, text: str | bytes) -> None:
        self.count += 1
        self.texts[f"{where} #{self.count}"] = text.decode(errors="replace") if isinstance(text, bytes) else text

    def found(self) -> list[str]:
        hits = []
        for name, secret in self.secrets.items():
            windows = {secret[at : at + WINDOW] for at in range(max(1, len(secret) - WINDOW + 1))}
            for where, text in self.texts.items():
                if any(window in text for window in windows):
                    hits.append(f"{name} in {where}")  # `where` is the key of `texts`
        return hits


def fernet_keys(settings) -> dict[str, str]:
    """The Fernet keys accounts/crypto.py uses, as text, and the SECRET_KEY they may derive from."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"exchange api secret encryption").derive(
        settings.SECRET_KEY.encode()
    )
    keys = {"SECRET_KEY": settings.SECRET_KEY, "derived Fernet key": base64.urlsafe_b64encode(derived).decode()}
    for index, key in enumerate(settings.API_SECRET_ENCRYPTION_KEYS):
        keys[f"API_SECRET_ENCRYPTION_KEYS[{index}]"] = key
    return keys


def _known(world: dict) -> dict:
    """Plausible values for the operations' parameters, so that requests reach past the checks."""
    return plausible_params(
        sub_email=world["sub"].user.email,
        sub_api_key=world["sub"].api_key.key,
        peer_email=world["peer"].email,
        to_email=world["sub"].user.email,
        new_sub_email="secrets-new-sub@test.example",
    ) | {
        "quoteId": "0" * 32,
        "apikey": world["sub"].api_key.key,
        "ipAddress": "203.0.113.9",
        "ipRestriction": "2",
        "clientRequestId": "secrets-collect",
        "listenKey": "x" * 60,
        "transfer_id": "1",
    }


def _operations() -> list[tuple[str, str, list[str], bool]]:
    found = []
    for path, operations in openapi_document()["paths"].items():
        for method, operation in operations.items():
            names = [p["name"] for p in operation.get("parameters", []) if p["in"] in ("query", "path")]
            found.append((method.upper(), path, names, bool(operation.get("security"))))
    return sorted(found)


def _traffic(world: dict, seen: Exposure) -> None:
    """Signed requests to every operation, then requests that fail authentication in every way."""
    known = _known(world)
    master = world["master"]
    for method, path, names, signed in _operations():
        caller = world["sub"] if "sub-to-master" in path or "sub-history" in path else master
        params = {name: known[name] for name in names if name in known and name != "transfer_id"}
        url = path.replace("{transfer_id}", known["transfer_id"])
        placements = ("query", "body") if method != "GET" else ("query",)
        for placement in placements:
            if placement == "query":
                response = caller.client.request(method, url, params, signed=signed)
            else:
                response = caller.client.request(method, url, body={**params, "timestamp": now_ms()}, signed=signed)
            seen.see(f"{method} {path} ({placement}) {response.status_code}", response.content)
    account = "/openapi/v1/account"
    client = master.client
    refusals = {
        "a signature made with another secret": client.get(account, signature=hmac_hex("not-the-secret", "x")),
        "a signature that is not hex": client.get(account, signature="zz" * 32),
        "a truncated signature": client.get(account, signature="ab" * 10),
        "a stale timestamp": client.get(account, timestamp=now_ms() - 3_600_000),
        "a timestamp ahead": client.get(account, timestamp=now_ms() + 3_600_000),
        "an unknown key": client.get(account, api_key="A" * 64),
        "no key": client.get(account, api_key=None),
        "a malformed body": client.post("/openapi/transfer/v4/transfers", body="{" * 50),
    }
    replayed = {"account": "PHP", "amount": "1", "target_address": world["peer"].email, "timestamp": now_ms()}
    first = client.post("/openapi/transfer/v4/transfers", replayed)
    refusals["a replayed signed write"] = client.post("/openapi/transfer/v4/transfers", replayed)
    seen.see("the replayed write's first answer", first.content)
    for what, response in refusals.items():
        seen.see(f"{what} {response.status_code}", response.content)


def _admin_pages(world: dict, seen: Exposure, make_superuser) -> str:
    """A key created, viewed, listed, disabled and enabled in the admin; returns the new secret."""
    admin = logged_in(make_superuser())
    owner = world["master"].user
    created = admin.post(
        reverse("admin:accounts_apikey_add"),
        {
            "user": owner.pk,
            "name": "desk",
            "types": [ApiKeyType.SPOT],
            "ip_list": "",
            "reason": "a desk key for the secrets test",
            "_save": "Save",
        },
    )
    assert created.status_code == 200, created.content[:300]
    secret = SECRET_RE.search(created.content.decode()).group(1)  # the creation page: the one place
    api_key = ApiKey.objects.get(key=KEY_RE.search(created.content.decode()).group(1))
    signed = SignedClient(api_key.key, secret).get("/openapi/v1/api-keys")
    assert signed.status_code == 200, signed.content
    seen.see("the new key's first request", signed.content)
    for url in (
        reverse("admin:accounts_apikey_change", args=[api_key.pk]),
        reverse("admin:accounts_apikey_changelist"),
        reverse("admin:accounts_apikey_changelist") + f"?q={api_key.key[:8]}",
        reverse("admin:accounts_user_change", args=[owner.pk]),
        reverse("admin:accounts_user_changelist"),
        reverse("admin:admin_logentry_changelist") if _has_logentry_admin() else reverse("admin:index"),
        reverse("admin:index"),
    ):
        page = admin.get(url)
        seen.see(f"admin page {url} {page.status_code}", page.content)
    for action in ("disable_keys", "enable_keys"):
        page = admin.post(
            reverse("admin:accounts_apikey_changelist"),
            {"action": action, "_selected_action": [str(api_key.pk)], "index": "0", "reason": "secrets test"},
            follow=True,
        )
        seen.see(f"admin action {action}", page.content)
    seen.see("admin log entries", "\n".join(entry.change_message for entry in LogEntry.objects.all()))
    seen.see("admin session", repr(dict(admin.session.items())))
    return secret


def _has_logentry_admin() -> bool:
    from django.contrib import admin

    return LogEntry in admin.site._registry


def _server_error(world: dict, seen: Exposure, monkeypatch) -> None:
    """An unexpected exception inside a signed request: logged with its traceback, answered -1000."""
    from accounts import apis as account_apis

    def broken(*args, **kwargs):
        raise RuntimeError("a failure inside the handler")

    monkeypatch.setattr(account_apis.presenters, "account_info_json", broken)
    response = world["master"].client.get("/openapi/v1/account")
    assert response.status_code == 500, response.content
    seen.see("a server error", response.content)


@pytest.fixture
def world(db, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**9
    settings.CONVERT_QUOTE_INTERVAL_MS = 0
    settings.API_SECRET_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # a Fernet key of its own
    networks = demo_networks()
    master = customer(email="secrets-master@test.example", funding={"BTC": "10", "PHP": "10000"})
    sub = customer(email="secrets-sub@test.example", master=master.user, is_virtual=True, funding={"BTC": "1"})
    peer = customer(email="secrets-peer@test.example").user
    for network in networks:
        WhitelistAddressFactory(account=master.user, network=network)
    convert_demo.load()
    _read_only, read_only_secret = ApiKeyFactory(user=master.user, types=[ApiKeyType.READ_ONLY])
    return {"master": master, "sub": sub, "peer": peer, "read_only_secret": read_only_secret}


@pytest.fixture
def make_superuser(db):
    return lambda: User.objects.create_superuser(email="root-secrets@staff.example", password="pw-for-tests")


def test_no_secret_in_logs_output_answers_or_admin_pages(world, settings, capfd, monkeypatch, make_superuser):
    seen = Exposure()
    with everything_logged() as logs:
        _traffic(world, seen)
        admin_secret = _admin_pages(world, seen, make_superuser)
        _server_error(world, seen, monkeypatch)
    seen.secrets = {
        "the master's API secret": world["master"].secret,
        "the sub-account's API secret": world["sub"].secret,
        "a read-only key's API secret": world["read_only_secret"],
        "the secret of the key created in the admin": admin_secret,
        **fernet_keys(settings),
    }
    out, err = capfd.readouterr()
    seen.see("captured stdout", out)
    seen.see("captured stderr", err)
    for number, line in enumerate(logs.lines):
        seen.see(f"log line {number}", line)
    # The scan covered a real amount of traffic, SQL included.
    assert len(logs.lines) > 200, len(logs.lines)
    assert any(line.startswith("django.db.backends DEBUG") for line in logs.lines)
    assert any("a failure inside the handler" in line for line in logs.lines)  # the traceback is in
    hits = seen.found()
    assert hits == [], [(hit, seen.texts[hit.rsplit(" in ", 1)[1]][:400]) for hit in hits]


def test_the_scanner_finds_a_planted_secret(world, capfd):
    """The check is real: a secret logged, printed or answered on purpose is found, even in part."""
    secret = world["master"].secret
    with everything_logged() as logs:
        logging.getLogger("accounts.services").debug("signing with %s", secret)
        logging.getLogger("django.db.backends").debug("(0.001) UPDATE ... params=('%s',)", secret[5:30])
    sys.stdout.write(f"leaked {secret[:20]}\n")
    sys.stderr.write(f"leaked {secret[-17:]}\n")
    planted_answer = Client().generic("GET", "/openapi/v1/nothing-here", content_type=FORM).content + secret.encode()
    captured = capfd.readouterr()
    for where, text in (
        ("log line", logs.lines[0]),
        ("SQL log line", logs.lines[1]),
        ("captured stdout", captured.out),
        ("captured stderr", captured.err),
        ("an answer", planted_answer),
    ):
        seen = Exposure(secrets={"canary": secret})
        seen.see(where, text)
        assert seen.found() == [f"canary in {where} #1"], where
    seen = Exposure(secrets={"canary": secret})
    seen.see("stderr", f"leaked {secret[-15:]}")  # fewer than 16 characters: not counted
    assert seen.found() == []


def test_a_secret_sent_in_the_wrong_place_is_not_repeated(world, capfd):
    """A client that sends its secret as the key, or as a parameter: the answer does not repeat it,
    and no log line does, except one. The key is looked up in the database by its text, so the SQL
    that django.db.backends logs at DEBUG (only with DEBUG on, or a forced debug cursor as here)
    carries what the client sent as the key: a secret swapped for the key lands there. Production
    runs with DEBUG off (exchange/settings/production.py)."""
    master = world["master"]
    seen = Exposure(secrets={"the master's API secret": master.secret})
    with everything_logged() as logs:
        as_key = master.client.get("/openapi/v1/account", api_key=master.secret)
        as_param = master.client.get("/openapi/v1/account", {"secret": master.secret})
    assert as_key.status_code == 401
    assert as_param.status_code == 200
    seen.see("the answer to the secret as the key", as_key.content)
    seen.see("the answer to the secret as a parameter", as_param.content)
    seen.see("captured output", "".join(capfd.readouterr()))
    sql_lookup = re.compile(r'^django\.db\.backends DEBUG .*WHERE "accounts_apikey"\."key" = ')
    for number, line in enumerate(logs.lines):
        if not sql_lookup.match(line):
            seen.see(f"log line {number}", line)
    assert seen.found() == []
