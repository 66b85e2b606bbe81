"""GET /openapi/v1/exchangeInfo (issue 26): the real service's shape, one symbol per convert market
customers can use, none TRADING (there is no spot order book), the `symbol`/`symbols` filters,
weight 10 to the IP, open (no key)."""

from __future__ import annotations

import logging
import time

import pytest

from convert.models import Pair
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

INFO = "/openapi/v1/exchangeInfo"
DEMO_SYMBOLS = ["BTCPHP", "BTCUSDT", "ETHUSDT", "USDTPHP"]


def _symbols(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["symbol"] for row in response.json()["symbols"]]


def test_the_real_services_shape_with_no_symbol_trading(client, convert_world):
    before = int(time.time() * 1000)
    response = client.get(INFO)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"timezone", "serverTime", "exchangeFilters", "symbols"}
    assert body["timezone"] == "UTC"
    assert type(body["serverTime"]) is int
    assert body["serverTime"] >= before - 2000
    assert body["exchangeFilters"] == []
    assert [row["symbol"] for row in body["symbols"]] == DEMO_SYMBOLS
    btc_php = body["symbols"][0]
    assert btc_php == {
        "symbol": "BTCPHP",
        "status": "BREAK",
        "baseAsset": "BTC",
        "baseAssetPrecision": btc_php["baseAssetPrecision"],
        "quoteAsset": "PHP",
        "quoteAssetPrecision": btc_php["quoteAssetPrecision"],
        "orderTypes": [],
        "filters": [],
    }
    assert all(row["status"] != "TRADING" for row in body["symbols"])
    assert response["X-SERVICE-USED-WEIGHT-1M"] == "10"


def test_a_market_without_an_enabled_pair_is_not_listed(client, convert_world):
    Pair.objects.filter(market__base__code="ETH", market__quote__code="USDT").update(enabled=False)
    assert "ETHUSDT" not in _symbols(client.get(INFO))
    Pair.objects.filter(source__code="USDT", target__code="ETH").update(enabled=True)  # one way is enough
    assert "ETHUSDT" in _symbols(client.get(INFO))


def test_symbol_and_symbols_filter_the_list(client, convert_world):
    assert _symbols(client.get(INFO, {"symbol": "ETHUSDT"})) == ["ETHUSDT"]
    assert _symbols(client.get(INFO, {"symbol": "btcphp"})) == ["BTCPHP"]  # any case
    # As ccxt and the real service's documentation send it: a JSON array, brackets percent-encoded.
    assert _symbols(client.get(f'{INFO}?symbols=%5B"USDTPHP","BTCPHP"%5D')) == ["USDTPHP", "BTCPHP"]
    assert _symbols(client.get(f"{INFO}?symbols=%5B%22BTCUSDT%22%5D")) == ["BTCUSDT"]


@pytest.mark.parametrize(
    ("query", "code", "part"),
    [
        ("symbol=DOGEPHP", -1025, "no such symbol: DOGEPHP"),
        ('symbols=%5B"BTCPHP","DOGEPHP"%5D', -1025, "no such symbol: DOGEPHP"),
        ("symbols=BTCPHP", -1025, "JSON array"),
        ("symbols=%5B%5D", -1025, "JSON array"),
        ("symbols=%5B1%5D", -1025, "JSON array"),
        ('symbol=BTCPHP&symbols=%5B"BTCPHP"%5D', -1107, "symbol, symbols"),
    ],
)
def test_bad_filters_are_refused_with_the_envelope(client, convert_world, query, code, part):
    assert_error(client.get(f"{INFO}?{query}"), code, 400, part)


def test_only_get(client, convert_world):
    assert_error(client.post(INFO), -1010, 405)


def _nothing_logged_as_an_error(caplog) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


@pytest.mark.parametrize(
    "query",
    [
        {"symbols": "[" * 2600},  # issue 34, finding 5: a 500 and a logged RecursionError
        "symbols=" + "[" * 3999,  # the longest `symbols` taken (raw: percent-encoded it is over 8 KiB)
        {"symbols": "[" * 17 + '"BTCPHP"' + "]" * 17},  # well formed, one level too deep
        {"symbols": '[{"a":' * 20},
        "symbols=" + "[" * 2600,  # the brackets not percent-encoded
    ],
)
def test_deeply_nested_symbols_are_invalid_not_a_500(client, convert_world, caplog, query):
    """Unauthenticated: the JSON of `symbols` is measured before it is parsed (exchange/api/jsontext.py)."""
    caplog.set_level(logging.INFO)
    response = client.get(INFO, query) if isinstance(query, dict) else client.get(f"{INFO}?{query}")
    assert_error(response, -1025, 400, "Parameter 'symbols' is not valid: nested deeper than 16 levels")
    _nothing_logged_as_an_error(caplog)


def test_brackets_inside_names_do_not_count_as_nesting(client, convert_world, caplog):
    caplog.set_level(logging.INFO)
    # in the JSON text: an escaped backslash, then an escaped quote, both inside the name
    name = "BTC" + "[" * 1000 + '\\\\\\"' + "{" * 500 + "PHP"
    response = client.get(INFO, {"symbols": '["BTCPHP","' + name + '"]'})
    assert_error(response, -1025, 400, "no such symbol: BTC[[[")
    assert _symbols(client.get(INFO, {"symbols": '["ETHUSDT"]'})) == ["ETHUSDT"]
    _nothing_logged_as_an_error(caplog)
