"""M3 and the low findings of the security review that concern input (docs/security.md): nothing a
client sends gives a 500, every request pays its IP weight whatever it ends in, and numbers and
text are bounded."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from accounts.ledger.check import ledger_check
from exchange.api.ratelimit import USED_WEIGHT_HEADER
from tests.support.assertions import assert_error
from tests.support.client import hmac_hex, now_ms
from tests.support.factories import UserFactory, customer
from wallet.models import Transfer

PING = "/openapi/v1/ping"


PEER = "peer@test.example"


@pytest.fixture
def client(db):
    """A customer holding PHP, who sends some to PEER."""
    UserFactory(email=PEER)
    return customer(funding={"PHP": "1000"}).client


def test_deeply_nested_json_is_bad_input_and_charged(db):
    anonymous = Client()
    for expected_weight in (1, 2):
        response = anonymous.generic("GET", PING, data="[" * 10_000, content_type="application/json")
        assert_error(response, -1010, 400)
        assert response[USED_WEIGHT_HEADER] == str(expected_weight)
    # Deeper still, the body is over API_MAX_BODY_BYTES (16 KB): refused for its size (413), charged too.
    response = anonymous.generic("GET", PING, data="[" * 100_000, content_type="application/json")
    assert_error(response, -1010, 413)
    assert response[USED_WEIGHT_HEADER] == "3"


def test_a_json_body_is_measured_before_it_is_parsed(client, caplog):
    """Issue 34, finding 5: JSON a client sends is bounded in size and depth before the parser
    sees it (exchange/api/jsontext.py); the answer is the body's usual -1010, nothing is logged as
    an error and nothing moves."""
    caplog.set_level(logging.INFO)
    anonymous = Client()
    response = anonymous.generic("GET", PING, data="[" * 2600, content_type="application/json")
    assert_error(response, -1010, 400, "Malformed JSON body: nested deeper than 16 levels")
    nested = "[" * 17 + "]" * 17
    body = f'{{"account": "PHP", "target_address": "{PEER}", "amount": "1", "timestamp": {now_ms()}, "x": {nested}}}'
    response = anonymous.generic(
        "POST",
        f"/openapi/transfer/v4/transfers?signature={hmac_hex(client.secret, body)}",
        data=body,
        content_type="application/json",
        headers={"X-SERVICE-APIKEY": client.api_key},
    )
    assert_error(response, -1010, 400, "Malformed JSON body: nested deeper than 16 levels")
    assert not Transfer.objects.exists()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def test_any_failure_is_charged_and_a_banned_ip_stays_banned(db, settings, monkeypatch):
    """Whatever exception a request ends in, its IP pays: over the limit the 429 and then the 418
    come, even for requests that blow up while being read."""
    from exchange.api import views

    def explode(*args, **kwargs):
        raise RuntimeError("boom while reading the request")

    monkeypatch.setattr(views.GatewayApi, "_raw_request", staticmethod(explode))
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 2
    anonymous = Client()
    codes = [anonymous.get(PING, REMOTE_ADDR="192.0.2.77").status_code for _ in range(4)]
    assert codes == [500, 500, 429, 418]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/openapi/transfer/v3/transfers", {"page": "9999999999999999999", "recvWindow": "5000"}),
        ("/openapi/transfer/v3/transfers", {"page": "2147483648", "recvWindow": "5000"}),  # INT is 32 bits
        # skips more than 10,000,000 rows
        ("/openapi/transfer/v3/transfers", {"page": "5002", "per_page": "2000", "recvWindow": "5000"}),
        ("/openapi/wallet/v1/deposit/history", {"offset": "9999999999999999999"}),
        ("/openapi/wallet/v1/deposit/history", {"offset": "10000001"}),
        ("/openapi/wallet/v1/withdraw/history", {"offset": "9999999999999999999"}),
    ],
)
def test_huge_pages_and_offsets_are_invalid(client, path, params):
    assert_error(client.get(path, params), -1025, 400)


def test_deepest_allowed_page_is_answered(client):
    response = client.get("/openapi/transfer/v3/transfers", {"page": "5001", "per_page": "2000", "recvWindow": "5000"})
    assert response.status_code == 200, response.content
    assert response.json()["transfers"] == []


@pytest.mark.parametrize("text", ["\x00", "hi\x00there", "\x07", "\x1b[31m", "\x7f", "\x85"])
def test_control_characters_in_strings_are_invalid(client, settings, text):
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    params = {"account": "PHP", "target_address": PEER, "amount": "1", "message": text}
    body = assert_error(client.post("/openapi/transfer/v4/transfers", params), -1025, 400)
    assert "message" in body["msg"]
    assert Transfer.objects.count() == 0
    assert ledger_check().ok


def test_tabs_and_new_lines_are_text(client, settings):
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    params = {"account": "PHP", "target_address": PEER, "amount": "1", "message": "a\tb\r\nc"}
    assert client.post("/openapi/transfer/v4/transfers", params).status_code == 200


@pytest.mark.parametrize("statuses", ["\uff11", "0,\uff12", "\u0661", " 1_0", "1,x"])
def test_statuses_take_ascii_digits_only(client, statuses):
    assert_error(client.get("/openapi/wallet/v1/deposit/history", {"statuses": statuses}), -1025, 400)


def test_ascii_statuses_are_accepted(client):
    assert client.get("/openapi/wallet/v1/deposit/history", {"statuses": "0, 1,3"}).status_code == 200


def test_a_refused_content_negotiation_is_charged_and_a_ban_holds(db, settings):
    """Found in review: `Accept: text/html` was refused before the charge, so neither counted nor
    stopped by a ban."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 2
    anonymous = Client()
    codes = [anonymous.get(PING, HTTP_ACCEPT="text/html", REMOTE_ADDR="192.0.2.78").status_code for _ in range(4)]
    assert codes[2:] == [429, 418]
    assert anonymous.get(PING, REMOTE_ADDR="192.0.2.78").status_code == 418


def test_a_lone_surrogate_in_a_json_string_is_invalid(client, settings):
    """Found in review: `"\\ud800"` passed the checks and PostgreSQL could not be sent it: a 500."""
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    from tests.support.client import hmac_hex, now_ms

    text = (
        '{"account":"PHP","target_address":"peer@test.example","amount":"1","message":"\\ud800",'
        f'"timestamp":"{now_ms()}"}}'
    )
    response = client.client.generic(
        "POST",
        f"/openapi/transfer/v4/transfers?signature={hmac_hex(client.secret, text)}",
        data=text,
        content_type="application/json",
        headers={"X-SERVICE-APIKEY": client.api_key},
    )
    assert_error(response, -1025, 400)
    assert Transfer.objects.count() == 0
