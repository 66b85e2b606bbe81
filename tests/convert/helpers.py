"""What the convert tests share (kept with them: they are the only users): the endpoints, envelope
assertions, expected prices and amounts computed independently of convert/services.py, and the
house's liquidity shards."""

from __future__ import annotations

import itertools
import time
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

from django.conf import settings
from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import Balance, BusinessType
from accounts.models import SystemRole
from convert.models import AssetPrice, Market, Pair

PAIRS = "/openapi/convert/v1/get-supported-trading-pairs"
QUOTE = "/openapi/convert/v1/get-quote"
ACCEPT = "/openapi/convert/v1/accept-quote"
HISTORY = "/openapi/convert/v1/query-order-history"

FAILED = 10000003
EXPIRED = "quote expired"
INSUFFICIENT = "insufficient balance"
LIQUIDITY = "failed to fetch liquidity, try again later"
PRICE_CHANGED = "price has changed and the updated rate must be confirmed"
ACCOUNT = "unable to fetch account information"
SUSPENDED = "convert is suspended; try again later"
NOT_FOUND = "quote does not exist"
USED = "quote was already accepted"
ONE_AMOUNT = "send exactly one of sourceAmount and targetAmount"

_references = itertools.count(1)


# --- the envelope ---------------------------------------------------------------------------------


def ok(response, *, total: bool = False):
    """A processed convert request: HTTP 200, exactly `{status: 0, error: "OK", data[, total]}`; its data."""
    assert response.status_code == 200, (response.status_code, response.content)
    body = response.json()
    assert set(body) == ({"status", "error", "data", "total"} if total else {"status", "error", "data"}), body
    assert (body["status"], body["error"]) == (0, "OK"), body
    return (body["data"], body["total"]) if total else body["data"]


def refused(response, message: str) -> dict:
    """A refusal of the convert rules: HTTP 200, exactly `{status: 10000003, error: message, data: null}`."""
    assert response.status_code == 200, (response.status_code, response.content)
    body = response.json()
    assert body == {"status": FAILED, "error": message, "data": None}, body
    return body


def quote(client, source: str, target: str, *, source_amount=None, target_amount=None):
    params = {"sourceCurrency": source, "targetCurrency": target}
    if source_amount is not None:
        params["sourceAmount"] = str(source_amount)
    if target_amount is not None:
        params["targetAmount"] = str(target_amount)
    return client.post(QUOTE, params)


def accept(client, quote_id: str):
    return client.post(ACCEPT, {"quoteId": quote_id})


# --- expected values, computed here -----------------------------------------------------------------

BPS = Decimal(10000)


def down(value: Decimal, places: int) -> Decimal:
    return value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_FLOOR)


def up(value: Decimal, places: int) -> Decimal:
    return value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_CEILING)


def asset_price(code: str) -> Decimal:
    """The asset's stored price in the numeraire (PHP in the tests; the numeraire itself is 1)."""
    if code == settings.CONVERT_NUMERAIRE:
        return Decimal(1)
    return AssetPrice.objects.get(asset__code=code).price


def market_price(source: str, target: str) -> Decimal:
    """Target units per source unit at the market: the ratio of the two assets' prices, unrounded."""
    with localcontext(prec=60):
        return asset_price(source) / asset_price(target)


PRICE_DIGITS = 12


def customer_price(source: str, target: str) -> Decimal:
    """The spec's price: target per source, the spread taken from the customer, rounded down to 12
    significant digits (at most 18 places; docs/convert.md)."""
    spread = Pair.objects.get(source__code=source, target__code=target).market.spread_bps
    with localcontext(prec=60):
        exact = market_price(source, target) * (1 - Decimal(spread) / BPS)
        return down(exact, min(18, PRICE_DIGITS - 1 - exact.adjusted()))


def set_asset_price(code: str, price, *, fresh: bool = True) -> None:
    """Set an asset's price (and anchor) in the numeraire, as a price source would; confirmed now
    unless `fresh=False`."""
    values = {"price": Decimal(price), "anchor_price": Decimal(price)}
    if fresh:
        values["price_updated_at"] = timezone.now()
    assert AssetPrice.objects.filter(asset__code=code).update(**values) == 1, code


def set_market(base: str, quote_code: str, price, *, spread_bps: int | None = None, fresh: bool = True) -> Market:
    """Make the market base/quote trade at `price` (quote units per base), as a price source would: by
    setting the base's price in the numeraire (or the quote's, when the base is the numeraire), so
    every other market stays consistent with it. Its spread too, when given."""
    market = Market.objects.get(base__code=base, quote__code=quote_code)
    with localcontext(prec=60):
        if base == settings.CONVERT_NUMERAIRE:
            set_asset_price(quote_code, (Decimal(1) / Decimal(price)).quantize(Decimal("1e-18")), fresh=fresh)
        else:
            set_asset_price(base, (Decimal(price) * asset_price(quote_code)).quantize(Decimal("1e-18")), fresh=fresh)
    if spread_bps is not None:
        market.spread_bps = spread_bps
        market.save(update_fields=["spread_bps"])
    return market


# --- balances and the house's liquidity -------------------------------------------------------------


def free(account_id: int, code: str) -> Decimal:
    row = Balance.objects.filter(account_id=account_id, asset__code=code).values_list("free", flat=True).first()
    return row if row is not None else Decimal(0)


def shards() -> list[int]:
    return ledger.role_account_ids(SystemRole.CONVERT_LIQUIDITY)


def shard_of(user) -> int:
    return ledger.shard_account_id(SystemRole.CONVERT_LIQUIDITY, user.pk)


def fees_account(user) -> int:
    """The shard of the fees account that `user`'s postings credit."""
    return ledger.shard_account_id(SystemRole.FEES, user.pk)


def fees_total(code: str) -> Decimal:
    """The fees collected in `code`: the sum over the fees account's shards."""
    rows = Balance.objects.filter(
        account_id__in=ledger.role_account_ids(SystemRole.FEES), asset__code=code
    ).values_list("free", flat=True)
    return sum(rows, Decimal(0))


def _reference(prefix: str) -> str:
    return f"{prefix}:{time.time_ns()}:{next(_references)}"


def house_total(code: str) -> Decimal:
    """The house's convert liquidity in `code`: the sum over its shards."""
    rows = Balance.objects.filter(account_id__in=shards(), asset__code=code).values_list("free", flat=True)
    return sum(rows, Decimal(0))


def drain(*shard_ids: int, code: str, leave: Decimal | str = "0") -> None:
    """Move the shards' `code` to equity, leaving `leave` in each: one operators' adjustment."""
    balances = Balance.objects.filter(account_id__in=shard_ids, asset__code=code).values_list("account_id", "free")
    equity = ledger.system_account_id(SystemRole.EQUITY)
    legs = []
    for shard, available in balances:
        if available > Decimal(leave):
            legs += ledger.move(shard, equity, code, available - Decimal(leave))
    if legs:
        ledger.post(legs=legs, kind=BusinessType.OTHERS, reference=_reference("drain"))


def refill(shard: int, code: str, amount: Decimal | str) -> None:
    equity = ledger.system_account_id(SystemRole.EQUITY)
    ledger.post(
        legs=ledger.move(equity, shard, code, Decimal(amount)), kind=BusinessType.OTHERS, reference=_reference("refill")
    )
