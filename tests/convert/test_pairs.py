"""get-supported-trading-pairs: the enabled pairs only, every field a string; and the gateway's
refusals of every convert endpoint in the `{code, msg}` form (read-only key -1020, a key without
"Enable Convert" -2019, a frozen account's key -2015); the order history is readable with any key."""

from __future__ import annotations

import pytest

from accounts.models import ApiKeyType
from convert.models import Order, Pair, Quote
from tests.convert.helpers import ACCEPT, HISTORY, PAIRS, QUOTE, ok
from tests.support.assertions import assert_error
from tests.support.client import now_ms
from tests.support.factories import customer

FIELDS = {"sourceCurrency", "targetCurrency", "minSourceAmount", "maxSourceAmount", "precision"}
DEMO_PAIRS = {
    ("BTC", "PHP"): ("0.0001", "5", "2"),
    ("PHP", "BTC"): ("50", "25000000", "8"),
    ("USDT", "PHP"): ("1", "500000", "2"),
    ("PHP", "USDT"): ("50", "25000000", "6"),
    ("ETH", "USDT"): ("0.001", "100", "6"),
    ("USDT", "ETH"): ("1", "500000", "8"),
    ("BTC", "USDT"): ("0.0001", "5", "6"),
    ("USDT", "BTC"): ("1", "500000", "8"),
}
QUOTE_PARAMS = {"sourceCurrency": "BTC", "targetCurrency": "PHP", "sourceAmount": "0.001"}


def _listed(client) -> dict[tuple[str, str], dict]:
    data = ok(client.post(PAIRS))
    assert isinstance(data, list)
    return {(p["sourceCurrency"], p["targetCurrency"]): p for p in data}


def test_every_enabled_pair_with_its_fields_as_strings(convert_world):
    alice = customer()
    listed = _listed(alice.client)
    assert set(listed) == set(DEMO_PAIRS)
    for (source, target), (minimum, maximum, precision) in DEMO_PAIRS.items():
        pair = listed[(source, target)]
        assert set(pair) == FIELDS
        assert all(isinstance(value, str) for value in pair.values()), pair
        assert pair == {
            "sourceCurrency": source,
            "targetCurrency": target,
            "minSourceAmount": minimum,
            "maxSourceAmount": maximum,
            "precision": precision,
        }


def test_a_disabled_pair_is_not_listed_and_its_reverse_still_is(convert_world):
    Pair.objects.filter(source__code="BTC", target__code="PHP").update(enabled=False)
    listed = _listed(customer().client)
    assert ("BTC", "PHP") not in listed
    assert ("PHP", "BTC") in listed
    assert len(listed) == len(DEMO_PAIRS) - 1
    Pair.objects.update(enabled=False)
    assert _listed(customer().client) == {}


@pytest.mark.parametrize(
    ("path", "params"),
    [(PAIRS, {}), (QUOTE, QUOTE_PARAMS), (ACCEPT, {"quoteId": "0" * 32})],
    ids=["pairs", "quote", "accept"],
)
def test_a_read_only_key_is_refused_with_1020(convert_world, path, params):
    reader = customer(funding={"BTC": "1"}, key_types=[ApiKeyType.READ_ONLY])
    assert_error(reader.client.post(path, params), -1020, 401)
    assert not Quote.objects.exists()


@pytest.mark.parametrize(
    ("path", "params"),
    [(PAIRS, {}), (QUOTE, QUOTE_PARAMS), (ACCEPT, {"quoteId": "0" * 32})],
    ids=["pairs", "quote", "accept"],
)
def test_a_key_without_enable_convert_is_refused_with_2019(convert_world, path, params):
    others = [ApiKeyType.SPOT, ApiKeyType.CRYPTO_WALLET, ApiKeyType.FIAT, ApiKeyType.ACCOUNT]
    trader = customer(funding={"BTC": "1"}, key_types=others)
    body = assert_error(trader.client.post(path, params), -2019, 401)
    assert "Enable Convert" in body["msg"]
    assert not Quote.objects.exists()


def test_a_key_with_only_enable_convert_may_convert(convert_world):
    trader = customer(funding={"BTC": "1"}, key_types=[ApiKeyType.CONVERT])
    assert _listed(trader.client)
    quote_id = ok(trader.client.post(QUOTE, QUOTE_PARAMS))["quoteId"]
    assert ok(trader.client.post(ACCEPT, {"quoteId": quote_id}))["status"] == "SUCCESS"


@pytest.mark.parametrize("types", [[ApiKeyType.READ_ONLY], [ApiKeyType.SPOT]], ids=["read-only", "spot"])
def test_the_order_history_is_readable_with_any_key(convert_world, types):
    reader = customer(key_types=types)
    assert ok(reader.client.post(HISTORY), total=True) == ([], 0)


@pytest.mark.parametrize(
    ("path", "params"),
    [(PAIRS, {}), (QUOTE, QUOTE_PARAMS), (ACCEPT, {"quoteId": "0" * 32}), (HISTORY, {})],
    ids=["pairs", "quote", "accept", "history"],
)
def test_a_frozen_accounts_key_is_refused_by_the_gateway(convert_world, path, params):
    alice = customer(funding={"BTC": "1"})
    alice.user.is_frozen = True
    alice.user.save()
    assert_error(alice.client.post(path, params), -2015, 401)
    assert not Quote.objects.exists()
    assert not Order.objects.exists()


def test_an_unsigned_request_gets_the_gateway_envelope(convert_world):
    alice = customer()
    assert_error(alice.client.post(PAIRS, signature="0" * 64), -1022)
    assert_error(alice.client.post(PAIRS, headers={"X-SERVICE-APIKEY": None}), -1002, 401)


def test_only_post(convert_world):
    alice = customer()
    response = alice.client.get(PAIRS)
    assert response.status_code == 405
    assert set(response.json()) == {"code", "msg"}


def test_a_stale_timestamp_gets_the_gateway_envelope(convert_world):
    alice = customer(funding={"BTC": "1"})
    response = alice.client.post(QUOTE, QUOTE_PARAMS, timestamp=now_ms() - 60_000)
    assert_error(response, -1021, 400)
    assert not Quote.objects.exists()


def test_the_rate_limit_gets_the_gateway_envelope(convert_world, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 3  # convert endpoints weigh 1 on the IP counter
    alice = customer(funding={"BTC": "1"})
    for _ in range(3):
        ok(alice.client.post(PAIRS))
    response = alice.client.post(QUOTE, QUOTE_PARAMS)
    assert_error(response, -1003, 429)
    assert not Quote.objects.exists()
