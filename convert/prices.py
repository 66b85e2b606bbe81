"""Where convert's prices come from, behind one small interface.

A price source answers `price(pair)`: the market's price in the pair's direction (target units per
one source unit, before the house's spread) and when it was last confirmed. The service never
quotes on a price older than CONVERT_PRICE_MAX_AGE_SECONDS: it refuses instead ("failed to fetch
liquidity, try again later").

The default, `ReferencePrices`, reads the `Market` rows operators keep in the admin; its `tick()`
(a periodic job, `convert.market_tick`, every CONVERT_MARKET_TICK_SECONDS) moves each market's
price by a bounded random walk around the operators' anchor and confirms it, so quotes really
change over time. A real feed plugs in by setting CONVERT_PRICE_SOURCE to the dotted path of a
class with the same two methods (`tick()` may do nothing if the feed pushes its prices itself, e.g.
by updating `Market.price` and `price_updated_at`), as CHAIN_ADAPTER does for the chain.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, localcontext
from functools import lru_cache
from typing import Protocol

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from convert.errors import LiquidityUnavailable
from convert.models import Market, Pair

BPS = Decimal(10000)


@dataclass(frozen=True)
class MarketPrice:
    price: Decimal  # target units per one source unit, before the spread
    as_of: datetime


class PriceSource(Protocol):
    def price(self, pair: Pair) -> MarketPrice | None: ...

    def tick(self) -> int: ...


class ReferencePrices:
    """Operators' reference prices (Market rows), moved by a simulated market."""

    def __init__(self, rng: random.Random | None = None):
        self.rng = rng or random.Random()  # noqa: S311 (a simulated market, not a secret)

    def price(self, pair: Pair) -> MarketPrice | None:
        row = Market.objects.filter(pk=pair.market_id).values("base_id", "price", "price_updated_at").first()
        if row is None or not row["price"] > 0:
            return None
        if row["base_id"] == pair.source_id:
            return MarketPrice(row["price"], row["price_updated_at"])
        with localcontext(prec=60):
            return MarketPrice(Decimal(1) / row["price"], row["price_updated_at"])

    def tick(self) -> int:
        """Move every market by at most its step, within its band around the anchor; confirm it."""
        now = timezone.now()
        moved = 0
        with transaction.atomic():
            for market in Market.objects.select_for_update().order_by("pk"):
                market.price = walk(market, self.rng)
                market.price_updated_at = now
                market.save(update_fields=["price", "price_updated_at"])
                moved += 1
        return moved


def walk(market: Market, rng: random.Random) -> Decimal:
    """One step of the bounded random walk (whole hundredths of a basis point; no float)."""
    with localcontext(prec=60):
        step = Decimal(rng.randint(-market.walk_step_bps * 100, market.walk_step_bps * 100)) / (BPS * 100)
        band = Decimal(market.walk_band_bps) / BPS
        low, high = market.anchor_price * (1 - band), market.anchor_price * (1 + band)
        price = min(max(market.price * (1 + step), low), high)
        return price.quantize(Decimal("1e-18"))


@lru_cache(maxsize=1)
def _source_for(path: str) -> PriceSource:
    return import_string(path)()


def source() -> PriceSource:
    return _source_for(settings.CONVERT_PRICE_SOURCE)


def current_price(pair: Pair) -> MarketPrice:
    """The pair's market price, or LiquidityUnavailable when there is none or it is stale."""
    found = source().price(pair)
    max_age = timedelta(seconds=settings.CONVERT_PRICE_MAX_AGE_SECONDS)
    if found is None or found.price <= 0 or timezone.now() - found.as_of > max_age:
        raise LiquidityUnavailable()
    return found
