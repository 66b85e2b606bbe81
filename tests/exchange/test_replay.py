"""A signed write is accepted once: the same signature again is refused (a captured request cannot
move money twice, even without a client id). Reads may be repeated."""

import pytest

from tests.support.assertions import assert_error
from tests.support.client import SignedClient, now_ms


@pytest.mark.django_db
def test_a_signed_write_sent_twice_is_refused_the_second_time(master, make_key, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 100_000
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    stamp = now_ms()
    # The transfer refuses for its own reason (unknown asset), but only after the signature was
    # accepted, so the second identical request shows the replay refusal.
    body = {"account": "NOPE", "target_address": "x@example.com", "amount": "1", "recvWindow": 5000}
    first = client.post("/openapi/transfer/v4/transfers", body, timestamp=stamp)
    assert first.json()["code"] != -1022
    again = client.post("/openapi/transfer/v4/transfers", body, timestamp=stamp)
    body_error = assert_error(again, -1022, 401)
    assert "replay" in body_error["msg"]
    fresh = client.post("/openapi/transfer/v4/transfers", body, timestamp=stamp + 1)
    assert fresh.json()["code"] != -1022


@pytest.mark.django_db
def test_upper_case_copy_of_a_used_signature_is_also_refused(master, make_key, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 100_000
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    from urllib.parse import urlencode

    from tests.support.client import hmac_hex

    stamp = now_ms()
    query = urlencode({"account": "NOPE", "target_address": "x@example.com", "amount": "1", "timestamp": stamp})
    signature = hmac_hex(secret, query)
    first = client.post(
        "/openapi/transfer/v4/transfers?" + query,
        signature=signature,
        signed=False,
        headers={"X-SERVICE-SIGNATURE": signature},
    )
    assert first.json()["code"] != -1022
    again = client.post(
        "/openapi/transfer/v4/transfers?" + query, signed=False, headers={"X-SERVICE-SIGNATURE": signature.upper()}
    )
    assert_error(again, -1022, 401)


@pytest.mark.django_db
def test_reads_may_be_repeated(signed_client):
    stamp = now_ms()
    assert signed_client.get("/openapi/v1/api-keys", timestamp=stamp).status_code == 200
    assert signed_client.get("/openapi/v1/api-keys", timestamp=stamp).status_code == 200


# --- refusals do not spend a signature; one storage round trip; memory storage; storage down -----

ECHO = "/openapi/test/echo"
TEST_URLS = "tests.exchange.gateway_test_urls"
WEIGHT = "X-SERVICE-USED-WEIGHT-1M"
UID_WEIGHT = "X-SERVICE-USED-UID-WEIGHT-1M"


def _same_write(client: SignedClient, stamp: int, **kw):
    """The same signed POST each time (same parameters, timestamp and so signature)."""
    return client.post(ECHO, {"a": "1"}, timestamp=stamp, **kw)


def _accepted(response) -> None:
    assert response.status_code == 200, response.content
    assert response.json() == {"method": "POST", "params": {"a": "1"}}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_replay_is_charged_to_the_ip_only(master, make_key):
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    stamp = now_ms()
    first = _same_write(client, stamp)
    _accepted(first)
    assert (first[WEIGHT], first[UID_WEIGHT]) == ("1", "0")  # the echo endpoint weighs 1 on the IP only
    again = _same_write(client, stamp)
    assert_error(again, -1022, 401)
    assert again[WEIGHT] == "2"
    assert UID_WEIGHT not in again.headers  # refused before the account is charged
    assert client.post(ECHO, {"a": "1"}, timestamp=stamp + 1)[WEIGHT] == "3"


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_request_refused_for_a_disabled_key_does_not_spend_its_signature(master, make_key):
    from accounts import services as account_services

    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    stamp = now_ms()
    account_services.api_key_set_status(api_key=api_key, enabled=False)
    assert_error(_same_write(client, stamp), -2015, 401)
    account_services.api_key_set_status(api_key=api_key, enabled=True)
    _accepted(_same_write(client, stamp))
    assert_error(_same_write(client, stamp), -1022, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_request_refused_for_its_ip_does_not_spend_its_signature(master, make_key):
    api_key, secret = make_key(master, ip_list=["192.0.2.7"])
    client = SignedClient(api_key.key, secret)
    stamp = now_ms()
    assert_error(_same_write(client, stamp, ip="192.0.2.8"), -2017, 401)
    _accepted(_same_write(client, stamp, ip="192.0.2.7"))


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_request_refused_for_a_read_only_key_does_not_spend_its_signature(master, make_key):
    api_key, secret = make_key(master, types=["Read only"])
    client = SignedClient(api_key.key, secret)
    stamp = now_ms()
    assert_error(_same_write(client, stamp), -1020, 401)
    api_key.types = ["Enable Spot"]
    api_key.save(update_fields=["types"])
    _accepted(_same_write(client, stamp))


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_captured_signature_sent_with_other_parameters_is_not_spent(master, make_key):
    """A bad signature (here: a genuine one on other parameters) is refused without being remembered,
    so the genuine request that carries it is still accepted."""
    from tests.support.client import hmac_hex

    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    stamp = now_ms()
    genuine = hmac_hex(secret, f"a=1&timestamp={stamp}")
    assert_error(client.post(ECHO, {"a": "2"}, timestamp=stamp, signature=genuine), -1022, 401)
    _accepted(client.post(ECHO, {"a": "1"}, timestamp=stamp, signature=genuine))


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_request_refused_for_its_timing_does_not_spend_its_signature(master, make_key, monkeypatch):
    from exchange.api import auth

    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    server_now = 1_750_000_000_000
    monkeypatch.setattr(auth, "server_time_ms", lambda: server_now)
    stamp = server_now + 1500  # a client clock 1.5 s ahead: too early now, fine 0.6 s later
    assert_error(_same_write(client, stamp), -1021, 400)
    monkeypatch.setattr(auth, "server_time_ms", lambda: server_now + 600)
    _accepted(_same_write(client, stamp))


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_request_refused_by_a_limit_or_a_ban_does_not_spend_its_signature(master, make_key, settings):
    from exchange.api import ratelimit
    from exchange.api.models import RateLimitBan

    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret, ip="192.0.2.9")
    stamp = now_ms()
    assert client.post(ECHO, {"b": "0"}, timestamp=stamp).status_code == 200
    assert_error(_same_write(client, stamp), -1003, 429)
    ratelimit.forgive("192.0.2.9")  # the window is over
    ban = ratelimit.rate_limit_ban_create(ip="192.0.2.9", reason="test")
    assert_error(_same_write(client, stamp), -1003, 418)
    ratelimit.rate_limit_ban_lift(ban=ban)
    assert RateLimitBan.objects.count() == 1
    _accepted(_same_write(client, stamp))


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_a_signed_write_costs_one_storage_round_trip(master, make_key, monkeypatch):
    from exchange.api import ratelimit

    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    _accepted(client.post(ECHO, {"a": "1"}))  # loads the key into this process's keyring
    connection = ratelimit.storage().get_connection()
    commands = []
    real = connection.execute_command

    def counting(*args, **options):
        commands.append(args[0])
        return real(*args, **options)

    monkeypatch.setattr(connection, "execute_command", counting)
    stamp = now_ms()
    _accepted(_same_write(client, stamp))
    assert commands == ["EVALSHA"]
    commands.clear()
    assert_error(_same_write(client, stamp), -1022, 401)
    assert commands == ["EVALSHA"]


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_embedded_memory_storage_refuses_replays_like_redis(master, make_key, settings):
    """`make run` without REDIS_URL keeps counters and used signatures in process memory."""
    from accounts import services as account_services
    from exchange.api import ratelimit

    settings.RATE_LIMIT_STORAGE_URL = "memory://"
    ratelimit.counters().reset()
    try:
        api_key, secret = make_key(master)
        client = SignedClient(api_key.key, secret)
        stamp = now_ms()
        account_services.api_key_set_status(api_key=api_key, enabled=False)
        assert_error(_same_write(client, stamp), -2015, 401)
        account_services.api_key_set_status(api_key=api_key, enabled=True)
        first = _same_write(client, stamp)
        _accepted(first)
        again = _same_write(client, stamp)
        assert "replay" in assert_error(again, -1022, 401)["msg"]
        assert UID_WEIGHT not in again.headers
        _accepted(client.post(ECHO, {"a": "1"}, timestamp=stamp + 1))
        assert client.get(ECHO, {"a": "1"}, timestamp=stamp).status_code == 200  # reads may repeat
        assert client.get(ECHO, {"a": "1"}, timestamp=stamp).status_code == 200
    finally:
        ratelimit.counters().reset()


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_storage_down_refuses_signed_writes_and_serves_reads(master, make_key, monkeypatch, caplog):
    """Documented choice (docs/security.md, M1): without the storage, limits fail open (reads are
    served uncounted, logged) but a signed write is refused (-1001): it could otherwise run twice."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from exchange.api import ratelimit
    from exchange.runtime.outage import Outage

    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)

    def down(*args, **kwargs):
        raise RedisConnectionError("storage down")

    take = ratelimit.Counters.take
    monkeypatch.setattr(ratelimit.Counters, "take", down)
    outage = Outage(ratelimit.logger, ratelimit.STORAGE_OUTAGE.what, settle=0.0)  # none logged yet in this test
    monkeypatch.setattr(ratelimit.charging, "STORAGE_OUTAGE", outage)  # where charge() reads it
    stamp = now_ms()
    for _ in range(2):
        response = _same_write(client, stamp)
        assert_error(response, -1001, 503)
        assert WEIGHT not in response.headers
    read = client.get(ECHO, {"a": "1"})
    assert read.status_code == 200
    assert WEIGHT not in read.headers
    # Logged once for the outage (with the cause), not once per request.
    logged = [r for r in caplog.records if r.name == ratelimit.logger.name]
    assert [r.getMessage() for r in logged] == [ratelimit.STORAGE_OUTAGE.what], logged
    assert "signed writes refused" in logged[0].getMessage()
    assert "not counted" in logged[0].getMessage()
    assert "storage down" in str(logged[0].exc_info[1])
    assert outage.down
    monkeypatch.setattr(ratelimit.Counters, "take", take)  # the storage is back
    assert client.get(ECHO, {"a": "2"}).status_code == 200
    assert not outage.down
    back = [r.getMessage() for r in caplog.records if r.name == ratelimit.logger.name][-1]
    assert "over: back after" in back, back


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls(TEST_URLS)
def test_the_same_signed_write_sent_concurrently_is_accepted_once(master, make_key):
    import threading

    from django.db import connection

    api_key, secret = make_key(master)
    stamp = now_ms()
    threads_count = 12
    barrier = threading.Barrier(threads_count)
    codes: list[int] = []
    lock = threading.Lock()

    def worker():
        try:
            barrier.wait(timeout=30)
            response = _same_write(SignedClient(api_key.key, secret), stamp)
            with lock:
                codes.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [200] + [401] * (threads_count - 1)
