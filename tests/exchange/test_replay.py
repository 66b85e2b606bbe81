"""A signed write is accepted once: the same signature again is refused (a captured request cannot
move money twice, even without a client id). Reads may be repeated."""

import pytest

from tests.conftest import SignedClient, assert_error, now_ms


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

    from tests.conftest import hmac_hex

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
