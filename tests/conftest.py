"""Fixtures shared by every test: accounts, keys, and a client that signs like a real one."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from io import StringIO
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.test import Client

from accounts import services as account_services
from accounts.keyring import keyrings
from accounts.ledger.posting import forget_asset_ids
from accounts.ledger.system import forget_cached_ids
from exchange.api import ratelimit
from exchange.ttlcache import clear_all

FORM = "application/x-www-form-urlencoded"
_counter = itertools.count(1)


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Each test starts with empty counters and no bans in the (real, Redis) limit storage (which
    has then seen no signature: its replay memory is complete, see ratelimit.Counters.reset)."""
    ratelimit.counters().reset()
    keyrings.clear()
    forget_asset_ids()  # the database is rolled back between tests; ids are not reused
    forget_cached_ids()
    clear_all()  # cached reference data of rolled-back tests
    _clear_listen_keys()  # account ids restart in a new test database: old keys would point at them
    yield
    ratelimit.storage().reset()


def _clear_listen_keys() -> None:
    from django.conf import settings

    if not settings.REDIS_URL:
        return
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter("streams:*", count=1000))
    if keys:
        client.delete(*keys)


def now_ms() -> int:
    return int(time.time() * 1000)


def hmac_hex(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


@pytest.fixture
def make_user(db):
    def make(email: str | None = None, phone: str | None = None, master=None, **extra):
        n = next(_counter)
        user = account_services.user_create(
            email=email or f"user{n}-{time.time_ns()}@test.example", phone=phone, password="pw-for-tests", master=master
        )
        for field, value in extra.items():
            setattr(user, field, value)
        if extra:
            user.save()
        return user

    return make


@pytest.fixture
def demo(db):
    """The demo world: assets, networks, funded accounts, the master's whitelist."""
    out = StringIO()
    call_command("demo", "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def make_key(db):
    def make(user, *, types=None, ip_list=None, ip_restrict=None, name="test"):
        created = account_services.api_key_create(
            user=user, name=name, types=types, ip_list=ip_list, ip_restrict=ip_restrict
        )
        return created.api_key, created.secret

    return make


class SignedClient:
    """Sends requests the way the official connector does: parameters urlencoded in the query
    string (or form body), `timestamp` added, `signature` = HMAC-SHA256 over totalParams."""

    def __init__(self, api_key: str, secret: str, ip: str = "127.0.0.1"):
        self.client = Client()
        self.api_key = api_key
        self.secret = secret
        self.ip = ip

    def request(
        self,
        method: str,
        path: str,
        params: dict | None = None,
        *,
        body: dict | str | None = None,
        signed: bool = True,
        timestamp: int | None = None,
        signature: str | None = None,
        headers: dict | None = None,
        ip: str | None = None,
        api_key: str | None = None,
    ):
        params = dict(params or {})
        if signed and timestamp is not False:
            params.setdefault("timestamp", timestamp if timestamp is not None else now_ms())
        query = urlencode(params) if params else ""
        body_text = urlencode(body) if isinstance(body, dict) else (body or "")
        if signed and signature is None:
            signature = hmac_hex(self.secret, query + body_text)
        if signed and signature:
            query = f"{query}&signature={signature}" if query else f"signature={signature}"
        all_headers = {"X-SERVICE-APIKEY": self.api_key if api_key is None else api_key, **(headers or {})}
        if all_headers["X-SERVICE-APIKEY"] is None:
            del all_headers["X-SERVICE-APIKEY"]
        return self.client.generic(
            method,
            f"{path}?{query}" if query else path,
            data=body_text,
            content_type=FORM,
            headers=all_headers,
            REMOTE_ADDR=ip or self.ip,
        )

    def get(self, path, params=None, **kw):
        return self.request("GET", path, params, **kw)

    def post(self, path, params=None, **kw):
        return self.request("POST", path, params, **kw)

    def put(self, path, params=None, **kw):
        return self.request("PUT", path, params, **kw)

    def delete(self, path, params=None, **kw):
        return self.request("DELETE", path, params, **kw)


@pytest.fixture
def master(make_user):
    return make_user(email="master@test.example", phone="+639170000001")


@pytest.fixture
def master_key(master, make_key):
    return make_key(master, name="master")


@pytest.fixture
def signed_client(master_key):
    api_key, secret = master_key
    return SignedClient(api_key.key, secret)


def assert_error(response, code: int, status: int | None = None) -> dict:
    """The envelope and the code (and the HTTP status when given)."""
    body = response.json()
    assert set(body) == {"code", "msg"}, body
    assert body["code"] == code, body
    assert isinstance(body["msg"], str)
    assert body["msg"]
    if status is not None:
        assert response.status_code == status, (response.status_code, body)
    return body
