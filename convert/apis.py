"""The spec's Convert endpoints. Every answer is the convert envelope (exchange/api/envelope.py):
`{status: 0, error: "OK", data[, total]}` on success; a refusal of the convert rules is a
ConvertError (convert/errors.py) that the one exception handler renders as
`{status: 10000003, error: <message>, data: null}`. Failures of the gateway itself (key, signature,
timing, parameters, rate limits) keep the `{code, msg}` form of every endpoint."""

from __future__ import annotations

from datetime import datetime

from rest_framework.response import Response

from accounts.models import ApiKeyType
from convert import presenters, selectors, services
from convert.models import OrderStatus
from exchange.api import envelope, jsontext
from exchange.api.auth import Security, server_time_ms
from exchange.api.errors import ParameterInvalid
from exchange.api.params import Param, ParamSpec, check_skip
from exchange.api.timewindow import end_from_ms, from_ms
from exchange.api.views import GatewayApi


class ConvertApi(GatewayApi):
    http_method_names = ["post"]
    convert_envelope = True  # refusals of the convert rules are 200 in the envelope (the OpenAPI document says so)
    security = Security.TRADE
    key_type = ApiKeyType.CONVERT
    ip_weight = 1


class SupportedPairsApi(ConvertApi):
    """The pairs customers may convert in (enabled by operators)."""

    params_spec = ParamSpec(())
    response_example = envelope.success(
        [
            {
                "sourceCurrency": "BTC",
                "targetCurrency": "PHP",
                "minSourceAmount": "0.0001",
                "maxSourceAmount": "5",
                "precision": "2",
            }
        ]
    )

    def post(self, request):
        return Response(envelope.success([presenters.pair_json(pair) for pair in selectors.pairs_enabled()]))


class QuoteApi(ConvertApi):
    """A firm quote, valid QUOTE_TTL_SECONDS; exactly one of sourceAmount and targetAmount."""

    params_spec = ParamSpec(
        (
            Param("sourceCurrency", required=True, max_length=16),
            Param("targetCurrency", required=True, max_length=16),
            Param("sourceAmount", "DECIMAL", description="What the customer pays; or targetAmount."),
            Param("targetAmount", "DECIMAL", description="What the customer receives; or sourceAmount."),
        )
    )
    response_example = envelope.success(
        {
            "quoteId": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            "sourceCurrency": "BTC",
            "targetCurrency": "PHP",
            "sourceAmount": "0.01000000",
            "targetAmount": "51896.00",
            "price": "5189600.43",
            "expiry": "10",
        }
    )

    def post(self, request):
        p = self.params
        quote = services.quote_create(
            user=self.account,
            source_code=p["sourceCurrency"],
            target_code=p["targetCurrency"],
            source_amount=p["sourceAmount"],
            target_amount=p["targetAmount"],
        )
        return Response(envelope.success(presenters.quote_json(quote, services.seconds_left(quote))))


class AcceptQuoteApi(ConvertApi):
    """Accept the caller's quote before it expires: one CONVERT posting, or a FAILED order."""

    params_spec = ParamSpec((Param("quoteId", required=True, max_length=64),))
    response_example = envelope.success({"orderId": "1001", "status": "SUCCESS"})

    def post(self, request):
        order = services.quote_accept(user=self.account, quote_id=self.params["quoteId"])
        return Response(envelope.success(presenters.accepted_json(order)))


def _period(start_ms: int | None, end_ms: int | None) -> tuple[datetime | None, datetime | None]:
    """startTime and endTime as datetimes; the end covers its whole millisecond (orders are stored
    with microseconds, and shown with their createdAt in ms)."""
    start = from_ms(start_ms, "startTime") if start_ms is not None else None
    end = end_from_ms(end_ms) if end_ms is not None else None
    return start, end


class OrderHistoryApi(ConvertApi):
    """The caller's orders, oldest first; without startTime/endTime the whole history."""

    security = Security.USER_DATA
    key_type = None
    is_write = False
    params_spec = ParamSpec(
        (
            Param("startTime", "LONG", min=0, description="ms; numeric string."),
            Param("endTime", "LONG", min=0, description="ms; numeric string."),
            Param("status", "ENUM", choices=tuple(OrderStatus.values), description="Only together with startTime."),
            Param("page", "INT", default=1, min=1),
            Param("size", "INT", default=10, min=1, max=100),
        )
    )
    response_example = {
        **envelope.success(
            [
                {
                    "orderId": "1001",
                    "quoteId": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                    "userId": "42",
                    "sourceCurrency": "BTC",
                    "targetCurrency": "PHP",
                    "sourceAmount": "0.01000000",
                    "targetAmount": "51896.00",
                    "price": "5189600.43",
                    "fee": "0.00",
                    "inversePrice": "0.000000192693",
                    "status": "SUCCESS",
                    "createdAt": "1764000000000",
                    "errorCode": "",
                    "errorMessage": "",
                }
            ],
            total=1,
        )
    }

    def post(self, request):
        p = self.params
        if p["status"] is not None and p["startTime"] is None:
            raise ParameterInvalid("status", "send it together with startTime")
        start, end = _period(p["startTime"], p["endTime"])
        if start is not None and end is not None and end < start:
            raise ParameterInvalid("endTime", "before startTime")
        check_skip("page", (p["page"] - 1) * p["size"])
        page = selectors.order_history(
            user_id=self.account.pk, start=start, end=end, status=p["status"], page=p["page"], size=p["size"]
        )
        return Response(envelope.success([presenters.order_json(o) for o in page.orders], total=page.total))


# At most this many symbols in one `symbols` filter (the service lists a few markets), in this many
# characters (bounded before the text is parsed: exchange/api/jsontext.py).
MAX_SYMBOLS = 100
MAX_SYMBOLS_CHARS = 4000


def _symbols_filter(text: str) -> list[str]:
    """`symbols` as the real service takes it: a JSON array of symbol names, sent with its brackets
    percent-encoded (`symbols=%5B"BTCPHP","ETHUSDT"%5D`)."""
    try:
        names = jsontext.loads(text, max_chars=MAX_SYMBOLS_CHARS)
    except jsontext.JsonRefused as exc:
        why = 'a JSON array of symbols, e.g. ["BTCPHP","ETHUSDT"]' if str(exc) == "not JSON" else str(exc)
        raise ParameterInvalid("symbols", why) from None
    if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
        raise ParameterInvalid("symbols", 'a JSON array of symbols, e.g. ["BTCPHP","ETHUSDT"]')
    if len(names) > MAX_SYMBOLS:
        raise ParameterInvalid("symbols", f"at most {MAX_SYMBOLS} symbols")
    return [name.upper() for name in names]


class ExchangeInfoApi(GatewayApi):
    """The markets as the real service's exchangeInfo lists its symbols (what ccxt's `load_markets()`
    reads first): one symbol per convert market customers can use (BTCPHP, ETHUSDT, ...). This
    service has no spot order book, so no symbol is TRADING: every status is BREAK, `orderTypes` and
    `filters` are empty, and the assets are exchanged through the convert endpoints. `symbol` or
    `symbols` (a JSON array) narrows the list; an unknown symbol is -1025."""

    ip_weight = 10
    http_method_names = ["get", "head"]
    params_spec = ParamSpec(
        (
            Param("symbol", max_length=32, description="One symbol, e.g. BTCPHP (any case)."),
            Param(
                "symbols",
                max_length=MAX_SYMBOLS_CHARS,
                description='A JSON array of symbols, brackets percent-encoded: %5B"BTCPHP","ETHUSDT"%5D.',
            ),
        ),
        conflicts=(("symbol", "symbols"),),
    )
    response_example = {
        "timezone": "UTC",
        "serverTime": 1764000000000,
        "exchangeFilters": [],
        "symbols": [
            {
                "symbol": "BTCPHP",
                "status": "BREAK",
                "baseAsset": "BTC",
                "baseAssetPrecision": 8,
                "quoteAsset": "PHP",
                "quoteAssetPrecision": 2,
                "orderTypes": [],
                "filters": [],
            }
        ],
    }

    def get(self, request):
        symbols = [presenters.exchange_symbol_json(market) for market in selectors.markets_listed()]
        if self.params["symbol"] is not None:
            wanted, name = [self.params["symbol"].upper()], "symbol"
        elif self.params["symbols"] is not None:
            wanted, name = _symbols_filter(self.params["symbols"]), "symbols"
        else:
            wanted, name = None, ""
        if wanted is not None:
            by_name = {row["symbol"]: row for row in symbols}
            unknown = [symbol for symbol in wanted if symbol not in by_name]
            if unknown:
                raise ParameterInvalid(name, f"no such symbol: {unknown[0]}")
            symbols = [by_name[symbol] for symbol in dict.fromkeys(wanted)]
        return Response({"timezone": "UTC", "serverTime": server_time_ms(), "exchangeFilters": [], "symbols": symbols})
