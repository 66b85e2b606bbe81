"""Convert's records as the spec renders them (inside the convert envelope, exchange/api/envelope.py):
amounts and prices as decimal strings, times in ms as strings."""

from __future__ import annotations

from decimal import Decimal, localcontext

from convert.models import Market, Order, Pair, Quote
from exchange.api.formatting import millis


def _plain(value: Decimal) -> str:
    """A decimal without exponent or trailing zeros: "0.0000002", "5200000"."""
    text = f"{value.normalize():f}"
    return text


def _fixed(value: Decimal, places: int) -> str:
    return f"{value:.{places}f}"


def pair_json(pair: Pair) -> dict:
    return {
        "sourceCurrency": pair.source.code,
        "targetCurrency": pair.target.code,
        "minSourceAmount": _plain(pair.min_source_amount),
        "maxSourceAmount": _plain(pair.max_source_amount),
        "precision": str(pair.precision),
    }


def quote_json(quote: Quote, seconds_left: int) -> dict:
    pair = quote.pair
    return {
        "quoteId": quote.quote_id,
        "sourceCurrency": pair.source.code,
        "targetCurrency": pair.target.code,
        "sourceAmount": _fixed(quote.source_amount, pair.source.transfer_precision),
        "targetAmount": _fixed(quote.target_amount, pair.precision),
        "price": _plain(quote.price),
        "expiry": str(seconds_left),
    }


def accepted_json(order: Order) -> dict:
    return {"orderId": str(order.pk), "status": order.status}


def _inverse(price: Decimal) -> str | None:
    if not price:
        return None
    with localcontext(prec=60):
        return _plain((Decimal(1) / price).quantize(Decimal("1e-18")))


def order_json(order: Order) -> dict:
    pair = order.pair
    return {
        "orderId": str(order.pk),
        "quoteId": order.quote.quote_id,
        "userId": str(order.user_id),
        "sourceCurrency": pair.source.code,
        "targetCurrency": pair.target.code,
        "sourceAmount": _fixed(order.source_amount, pair.source.transfer_precision),
        "targetAmount": _fixed(order.target_amount, pair.precision),
        "price": _plain(order.price),
        "fee": _fixed(order.fee, pair.precision),
        "inversePrice": _inverse(order.price),
        "status": order.status,
        "createdAt": str(millis(order.created_at)),
        "errorCode": order.error_code,
        "errorMessage": order.error_message,
    }


def exchange_symbol_json(market: Market) -> dict:
    """A market as a symbol of GET /openapi/v1/exchangeInfo. There is no spot order book: the status
    is BREAK (the real service's "no trading now"), no order type is accepted and there is no order
    filter; the assets are exchanged through the convert endpoints (docs/api.md, "exchangeInfo")."""
    return {
        "symbol": f"{market.base.code}{market.quote.code}",
        "status": "BREAK",
        "baseAsset": market.base.code,
        "baseAssetPrecision": market.base.transfer_precision,
        "quoteAsset": market.quote.code,
        "quoteAssetPrecision": market.quote.transfer_precision,
        "orderTypes": [],
        "filters": [],
    }
