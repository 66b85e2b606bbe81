"""Issue 25, finding 5: a request that fails authentication is never free. Whatever the endpoint's
weights (IP weight 0 on the sub-account endpoints, transaction history and withdraw apply, which a
known caller pays by UID), a refused request costs its IP at least REFUSAL_WEIGHT, so a client
trying keys meets the IP limit (429 -1003) and then the ban (418) like anyone else; and an unknown
key is looked up in the database once per API_KEY_CACHE_SECONDS (accounts/keyring.py), while a
key created meanwhile works at once.

Counters and bans live in the real Redis, emptied before each test (tests/conftest.py).
"""

from __future__ import annotations

import re
import secrets
import time

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern

import accounts.services as account_services
from accounts.keyring import keyrings
from exchange import api_urls
from exchange.api.models import RateLimitBan
from exchange.api.ratelimit import REFUSAL_WEIGHT
from exchange.api.views import GatewayApi
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db

SUB_ACCOUNT_LIST = "/openapi/v1/sub-account/list"  # USER_DATA, Weight(IP) 0, Weight(UID) 10
API_KEYS = "/openapi/v1/api-keys"
WEIGHT = "X-SERVICE-USED-WEIGHT-1M"
IP = "198.51.100.25"


def random_key() -> str:
    return secrets.token_hex(32)  # 64 characters, the shape of a real key


def stranger(ip: str = IP) -> SignedClient:
    """A client with a key and secret nobody issued."""
    return SignedClient(random_key(), secrets.token_hex(32), ip=ip)


def key_queries(captured) -> int:
    """Look-ups of API keys by their text: what an unknown key costs the database."""
    return sum(1 for query in captured.captured_queries if "accounts_apikey" in query["sql"])


def assert_limited(response) -> None:
    assert_error(response, -1003, 429, msg_contains="limit")


def assert_banned(response) -> None:
    assert_error(response, -1003, 418)


def failures_allowed(weight: int, limit: int) -> int:
    """How many refusals of `weight` an IP may make in a window before the 429."""
    return limit // max(weight, REFUSAL_WEIGHT)


# --- an endpoint of IP weight 0 ---------------------------------------------------------------------


def unknown_key(master_key):
    return stranger().get(SUB_ACCOUNT_LIST), -2018, 401


def bad_signature(master_key):
    api_key, secret = master_key
    return SignedClient(api_key.key, secret, ip=IP).get(SUB_ACCOUNT_LIST, signature="0" * 64), -1022, 401


def missing_key(master_key):
    api_key, secret = master_key
    return SignedClient(api_key.key, secret, ip=IP).get(SUB_ACCOUNT_LIST, api_key=""), -1002, 401


def stale_timestamp(master_key):
    api_key, secret = master_key
    return SignedClient(api_key.key, secret, ip=IP).get(SUB_ACCOUNT_LIST, timestamp=1), -1021, 400


@pytest.mark.parametrize("attempt", [unknown_key, bad_signature, missing_key, stale_timestamp])
def test_failed_authentication_on_an_ip_weight_0_endpoint_is_limited_then_banned(master_key, attempt):
    """With the default limits (120 a minute): 120 refusals, the 429, the ban. It was 300 x 401
    and never a 429 (the same with unknown keys on /v1/account was banned after 13)."""
    from django.conf import settings

    limit = settings.IP_WEIGHT_LIMIT_PER_MINUTE
    for n in range(1, failures_allowed(0, limit) + 1):
        response, code, status = attempt(master_key)
        assert_error(response, code, status)
        assert response[WEIGHT] == str(n * REFUSAL_WEIGHT), n
    response, *_ = attempt(master_key)
    assert_limited(response)
    response, *_ = attempt(master_key)
    assert_banned(response)
    assert RateLimitBan.objects.filter(ip=IP).count() == 1


def test_a_banned_ip_gets_418_before_any_key_look_up(master_key):
    limit = 5
    with override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=limit):
        for _ in range(limit):
            assert_error(stranger().get(SUB_ACCOUNT_LIST), -2018, 401)
        assert_limited(stranger().get(SUB_ACCOUNT_LIST))
        assert_banned(stranger().get(SUB_ACCOUNT_LIST))
        with CaptureQueriesContext(connection) as captured:
            for _ in range(20):
                assert_banned(stranger().get(SUB_ACCOUNT_LIST))
    assert key_queries(captured) == 0


def test_a_known_caller_still_pays_ip_weight_0(master_key):
    """The floor is for refusals only: the honest caller's IP counter does not move."""
    client = SignedClient.of(master_key, ip=IP)
    for _ in range(3):
        response = client.get(SUB_ACCOUNT_LIST)
        assert response.status_code == 200, response.content
        assert response[WEIGHT] == "0"


# --- every keyed endpoint ---------------------------------------------------------------------------


def keyed_endpoints() -> list[tuple[str, str, int]]:
    """(method, path, IP weight) of every /openapi/ endpoint that takes an API key, from the URL conf."""
    found = []
    for pattern in api_urls.urlpatterns:
        assert isinstance(pattern, URLPattern), pattern
        view = getattr(pattern.callback, "view_class", None)
        if view is None or not issubclass(view, GatewayApi) or not view.security.needs_key:
            continue
        path = "/openapi/" + re.sub(r"<[^>]+>", "1", str(pattern.pattern))
        for method in view.http_method_names:
            if method != "head" and hasattr(view, method):
                found.append((method.upper(), path, view().option("ip_weight", method.upper())))
    return found


def test_the_url_conf_has_keyed_endpoints_of_ip_weight_0():
    """The sweep below covers the endpoints of the finding (and a new one comes with it)."""
    endpoints = keyed_endpoints()
    assert len(endpoints) > 25
    zero = {path for _, path, weight in endpoints if weight == 0}
    assert {SUB_ACCOUNT_LIST, "/openapi/v1/sub-account/transfer/universal-transfer"} <= zero
    assert "/openapi/wallet/v1/withdraw/apply" in zero


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=30)
def test_every_keyed_endpoint_limits_then_bans_an_ip_trying_unknown_keys():
    """One IP per endpoint: every attempt with a key nobody issued is -2018 until the IP has spent
    its limit (at most limit / REFUSAL_WEIGHT attempts, fewer where the endpoint weighs more), then
    429 -1003, then 418."""
    limit = 30
    for index, (method, path, weight) in enumerate(keyed_endpoints()):
        ip = f"198.18.{index // 200}.{index % 200 + 1}"
        allowed = failures_allowed(weight, limit)
        assert allowed <= failures_allowed(0, limit)
        for n in range(allowed):
            response = stranger(ip).request(method, path)
            assert response.status_code == 401, (method, path, n, response.content)
            assert response.json()["code"] == -2018, (method, path, n)
        response = stranger(ip).request(method, path)
        assert response.status_code == 429, (method, path, response.content)
        assert response.json()["code"] == -1003, (method, path)
        response = stranger(ip).request(method, path)
        assert response.status_code == 418, (method, path, response.content)
        assert response.json()["code"] == -1003, (method, path)


# --- the database: one look-up per unknown key per cache period ------------------------------------


# The revocation log's bound is kept out of the way (it would end the remembering early on a loaded
# machine whose log reader is late): the period under test is the cache's.
@override_settings(API_KEY_CACHE_SECONDS=1, API_KEY_REVOCATION_SECONDS=60)
def test_an_unknown_key_is_looked_up_once_per_cache_period():
    """Within API_KEY_CACHE_SECONDS of the look-up, however many requests: no other look-up. The
    process forgets the key when the period is over and not before; then one look-up again, and
    remembered again."""
    client = stranger()
    asked = time.monotonic()
    with CaptureQueriesContext(connection) as captured:
        for _ in range(30):
            assert_error(client.get(SUB_ACCOUNT_LIST), -2018, 401)
    assert key_queries(captured) == 1
    assert keyrings.cached(client.api_key)

    forgotten = wait_until(lambda: not keyrings.cached(client.api_key), what="the unknown key forgotten")
    assert forgotten - asked >= 1  # not before the period is over
    with CaptureQueriesContext(connection) as captured:
        for _ in range(20):
            assert_error(client.get(SUB_ACCOUNT_LIST), -2018, 401)
    assert key_queries(captured) == 1
    assert keyrings.cached(client.api_key)


def test_new_unknown_keys_each_time_are_bounded_by_the_ip_charge():
    """A fresh key per request is a look-up each, but each is charged: after the limit the 429, the
    ban, and no more look-ups."""
    limit = 40
    with override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=limit), CaptureQueriesContext(connection) as captured:
        answers = [stranger().get(SUB_ACCOUNT_LIST).status_code for _ in range(200)]
    assert answers[:limit] == [401] * limit
    assert answers[limit] == 429
    assert set(answers[limit + 1 :]) == {418}
    assert key_queries(captured) <= limit + 1


def test_a_key_created_after_it_was_refused_as_unknown_works_at_once(master, monkeypatch):
    """The remembered "unknown" must not outlive the key's creation: the customer who creates a
    key uses it on the next request."""
    key, secret = random_key(), secrets.token_hex(32)
    client = SignedClient(key, secret, ip=IP)
    assert_error(client.get(API_KEYS), -2018, 401)
    with CaptureQueriesContext(connection) as captured:
        assert_error(client.get(API_KEYS), -2018, 401)
    assert key_queries(captured) == 0  # remembered

    tokens = iter([secret, key])  # api_key_create draws the secret, then the key
    monkeypatch.setattr(account_services, "_random_token", lambda length: next(tokens))
    created = account_services.api_key_create(user=master, name="new")
    assert created.api_key.key == key

    response = client.get(API_KEYS)
    assert response.status_code == 200, response.content
    assert [k["apiName"] for k in response.json()] == ["new"]
