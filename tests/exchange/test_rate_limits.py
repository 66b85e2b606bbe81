"""Weighted IP/UID limits, 429 -> 418 bans and their escalation (spec "Limits", DESIGN 2).

Counters and bans live in the real Redis; the autouse fixture in tests/conftest.py empties it
before each test. `storage().reset()` inside a test stands for "the minute window and the ban have
run out" (both are Redis keys with a TTL), without waiting for them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from exchange.api import ratelimit
from exchange.api.models import RateLimitBan
from tests.support.assertions import assert_error
from tests.support.client import SignedClient

PING = "/openapi/v1/ping"
STATUS = "/openapi/v1/check-sys-status"
API_KEYS = "/openapi/v1/api-keys"
WEIGHT = "X-SERVICE-USED-WEIGHT-1M"
UID_WEIGHT = "X-SERVICE-USED-UID-WEIGHT-1M"
IP_A = "192.0.2.10"
IP_B = "192.0.2.20"

pytestmark = pytest.mark.django_db


def ping(client: Client, ip: str = IP_A):
    return client.get(PING, REMOTE_ADDR=ip)


def retry_after(response) -> int:
    value = response.headers.get("Retry-After")
    assert value is not None, f"no Retry-After on {response.status_code}"
    assert value.isdigit(), value
    return int(value)


def assert_429(response) -> None:
    body = assert_error(response, -1003, 429)
    assert "limit" in body["msg"]
    assert 1 <= retry_after(response) <= 60


def assert_418(response, low: int, high: int) -> None:
    assert_error(response, -1003, 418)
    assert low <= retry_after(response) <= high, retry_after(response)


def exceed_and_continue(client: Client, limit: int, ip: str = IP_A) -> None:
    """`limit` successful pings, the 429, then the request that earns the ban (left unchecked)."""
    for n in range(1, limit + 1):
        response = ping(client, ip)
        assert response.status_code == 200, (n, response.content)
    assert_429(ping(client, ip))


# --- used-weight header -------------------------------------------------------------------------


def test_weight_header_counts_up_on_successes(client):
    for expected in (1, 2, 3):
        response = ping(client)
        assert response.status_code == 200
        assert response[WEIGHT] == str(expected)
    assert UID_WEIGHT not in response.headers


def test_weight_header_on_a_parameter_error(client):
    response = client.get(STATUS, {"businessType": "FUTURES"}, REMOTE_ADDR=IP_A)
    assert_error(response, -1025, 400)
    assert response[WEIGHT] == "2"


def test_weight_header_on_an_unknown_path(client):
    ping(client)
    response = client.get("/openapi/v1/no-such-endpoint", REMOTE_ADDR=IP_A)
    assert_error(response, -1010, 404)
    assert response[WEIGHT] == "2"


@pytest.mark.parametrize("method", ["post", "patch"])
def test_weight_header_on_a_method_not_allowed(client, method):
    response = getattr(client, method)(PING, REMOTE_ADDR=IP_A)
    assert_error(response, -1010, 405)
    assert response[WEIGHT] == "1"


def test_weight_header_on_an_authentication_error(signed_client):
    response = signed_client.get(API_KEYS, signature="0" * 64, ip=IP_A)
    assert_error(response, -1022, 401)
    assert response[WEIGHT] == "1"
    assert UID_WEIGHT not in response.headers  # refused before the account is known


def test_check_sys_status_weighs_uid_2_against_the_ip_when_unauthenticated(client):
    first = client.get(STATUS, REMOTE_ADDR=IP_A)
    assert first.status_code == 200
    assert first[WEIGHT] == "2"
    assert ping(client)[WEIGHT] == "3"
    assert client.get(STATUS, REMOTE_ADDR=IP_A)[WEIGHT] == "5"


def test_signed_endpoint_reports_ip_and_uid_weight(master_key):
    api_key, secret = master_key
    signer = SignedClient(api_key.key, secret, ip=IP_A)
    for expected in ("1", "2"):
        response = signer.get(API_KEYS)
        assert response.status_code == 200, response.content
        assert response[WEIGHT] == expected
        assert response[UID_WEIGHT] == expected


# --- 429, then 418 -------------------------------------------------------------------------------


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=3)
def test_exceeding_the_ip_limit_gives_429_with_retry_after(client):
    for _ in range(3):
        assert ping(client).status_code == 200
    response = ping(client)
    assert_429(response)
    assert response[WEIGHT] == "4"
    assert not RateLimitBan.objects.exists()  # a 429 is a warning, not a ban


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=3)
def test_request_after_429_is_banned_for_120_seconds(client):
    exceed_and_continue(client, 3)
    before = timezone.now()
    response = ping(client)
    assert_418(response, 115, 121)
    ban = RateLimitBan.objects.get()
    assert ban.ip == IP_A
    assert ban.offence == 1
    assert ban.duration_seconds == 120
    assert ban.lifted_at is None
    assert before + timedelta(seconds=115) <= ban.expires_at <= timezone.now() + timedelta(seconds=121)


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=3)
def test_requests_while_banned_get_418_and_create_no_more_bans(client):
    exceed_and_continue(client, 3)
    assert_418(ping(client), 115, 121)
    for _ in range(5):
        assert_418(ping(client), 1, 121)
    # An endpoint other than ping, and an unknown path, are refused the same way.
    assert_418(client.get(STATUS, REMOTE_ADDR=IP_A), 1, 121)
    assert_418(client.get("/openapi/v1/nothing-here", REMOTE_ADDR=IP_A), 1, 121)
    assert RateLimitBan.objects.count() == 1


def test_requests_while_banned_are_not_counted(client):
    ban = ratelimit.rate_limit_ban_create(ip=IP_A, reason="test")
    for _ in range(10):
        assert_418(ping(client), 1, 121)
    ratelimit.rate_limit_ban_lift(ban=ban)
    response = ping(client)
    assert response.status_code == 200
    assert response[WEIGHT] == "1"


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=2)
def test_a_second_ip_is_not_limited_when_the_first_is(client):
    exceed_and_continue(client, 2, ip=IP_A)
    assert_418(ping(client, IP_A), 115, 121)
    response = ping(client, IP_B)
    assert response.status_code == 200
    assert response[WEIGHT] == "1"
    assert list(RateLimitBan.objects.values_list("ip", flat=True)) == [IP_A]


# --- escalation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offence", "seconds"),
    [
        (1, 120),
        (2, 240),
        (3, 480),
        (4, 960),
        (11, 120 * 2**10),
        (12, 120 * 2**11),  # 245 760 s, still under 3 days
        (13, 259_200),
        (50, 259_200),
        (10**6, 259_200),
    ],
)
def test_ban_duration_doubles_and_is_capped_at_three_days(offence, seconds):
    assert ratelimit.ban_duration_seconds(offence=offence) == seconds


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=2)
def test_repeat_offences_double_the_ban(client):
    """120, 240, 480: each time the window and the ban have run out before the next offence."""
    for offence, seconds in ((1, 120), (2, 240), (3, 480)):
        ratelimit.storage().reset()  # the minute window and the previous ban are over
        exceed_and_continue(client, 2)
        assert_418(ping(client), seconds - 5, seconds + 1)
        ban = RateLimitBan.objects.order_by("-id").first()
        assert (ban.offence, ban.duration_seconds) == (offence, seconds)
    assert RateLimitBan.objects.count() == 3


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=2)
def test_second_ban_after_a_lift_is_offence_2_for_240_seconds(client):
    exceed_and_continue(client, 2)
    assert_418(ping(client), 115, 121)
    ratelimit.rate_limit_ban_lift(ban=RateLimitBan.objects.get())

    exceed_and_continue(client, 2)
    assert_418(ping(client), 235, 241)
    latest = RateLimitBan.objects.order_by("-id").first()
    assert (latest.offence, latest.duration_seconds) == (2, 240)


def test_bans_older_than_three_days_do_not_escalate(client):
    old = ratelimit.rate_limit_ban_create(ip=IP_A, reason="long ago")
    RateLimitBan.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3, minutes=1))
    recent = ratelimit.rate_limit_ban_create(ip=IP_A, reason="yesterday")
    assert (recent.offence, recent.duration_seconds) == (1, 120)
    RateLimitBan.objects.filter(pk=recent.pk).update(created_at=timezone.now() - timedelta(days=1))
    latest = ratelimit.rate_limit_ban_create(ip=IP_A, reason="now")
    assert (latest.offence, latest.duration_seconds) == (2, 240)
    # Another address starts from the beginning.
    assert ratelimit.rate_limit_ban_create(ip=IP_B, reason="other").offence == 1


# --- lifting -------------------------------------------------------------------------------------


def test_lifting_a_ban_made_by_the_service_lets_the_ip_through(client):
    ban = ratelimit.rate_limit_ban_create(ip=IP_A, reason="test")
    assert_418(ping(client), 115, 121)
    lifted = ratelimit.rate_limit_ban_lift(ban=ban)
    assert lifted.lifted_at is not None
    assert ping(client).status_code == 200


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=3)
def test_lifting_a_ban_earned_by_requests_lets_the_ip_through_immediately(client):
    exceed_and_continue(client, 3)
    assert_418(ping(client), 115, 121)
    ban = ratelimit.rate_limit_ban_lift(ban=RateLimitBan.objects.get())
    assert ban.lifted_at is not None
    response = ping(client)
    assert response.status_code == 200, (response.status_code, response.content, response.headers)
    assert RateLimitBan.objects.count() == 1


# --- UID limit -----------------------------------------------------------------------------------


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=100, UID_WEIGHT_LIMIT_PER_MINUTE=4)
def test_uid_limit_is_shared_by_all_ips_using_the_account(master_key):
    api_key, secret = master_key
    signer = SignedClient(api_key.key, secret)
    for n, ip in enumerate((IP_A, IP_B, IP_A, IP_B), start=1):
        response = signer.get(API_KEYS, ip=ip)
        assert response.status_code == 200, response.content
        assert response[UID_WEIGHT] == str(n)
        assert response[WEIGHT] == str((n + 1) // 2)  # each IP has its own counter
    response = signer.get(API_KEYS, ip="192.0.2.30")  # a third address, same account
    assert_429(response)
    assert response[UID_WEIGHT] == "5"
    assert response[WEIGHT] == "1"


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=100, UID_WEIGHT_LIMIT_PER_MINUTE=2)
def test_uid_limit_of_one_account_does_not_limit_another(make_user, make_key):
    first = SignedClient(*_key_and_secret(make_user, make_key), ip=IP_A)
    second = SignedClient(*_key_and_secret(make_user, make_key), ip=IP_A)
    for _ in range(2):
        assert first.get(API_KEYS).status_code == 200
    assert_429(first.get(API_KEYS))
    response = second.get(API_KEYS, ip=IP_B)
    assert response.status_code == 200, response.content
    assert response[UID_WEIGHT] == "1"


def _key_and_secret(make_user, make_key) -> tuple[str, str]:
    api_key, secret = make_key(make_user())
    return api_key.key, secret


# --- concurrency ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=10)
def test_concurrent_requests_exactly_the_limit_succeed_and_one_ban_is_created():
    threads_count = 40
    barrier = threading.Barrier(threads_count)
    statuses: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker():
        client = Client()
        try:
            barrier.wait(timeout=30)
            response = client.get(PING, REMOTE_ADDR=IP_A)
            with lock:
                statuses.append(response.status_code)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            with lock:
                errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(threads_count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert time.monotonic() - started < 120
    counts = Counter(statuses)
    assert len(statuses) == threads_count
    assert counts[200] == 10, counts
    assert counts[429] == 1, counts
    assert counts[418] == threads_count - 11, counts
    bans = list(RateLimitBan.objects.all())
    assert len(bans) == 1, bans
    assert (bans[0].ip, bans[0].offence, bans[0].duration_seconds) == (IP_A, 1, 120)
    assert_418(Client().get(PING, REMOTE_ADDR=IP_A), 1, 121)


@pytest.mark.django_db
def test_embedded_memory_storage_limits_and_bans_like_redis(client):
    """`make run` without REDIS_URL keeps the counters in process memory: same rules."""
    from exchange.api import ratelimit
    from exchange.api.models import RateLimitBan
    from exchange.api.ratelimit import rate_limit_ban_lift

    with override_settings(RATE_LIMIT_STORAGE_URL="memory://", IP_WEIGHT_LIMIT_PER_MINUTE=3):
        ratelimit.counters().reset()
        codes = [client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.50").status_code for _ in range(6)]
        assert codes == [200, 200, 200, 429, 418, 418]
        ban = RateLimitBan.objects.get(ip="192.0.2.50")
        assert ban.duration_seconds == 120
        rate_limit_ban_lift(ban=ban)
        assert client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.50").status_code == 200
        ratelimit.counters().reset()
