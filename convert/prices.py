"""Where convert's prices come from, and the guard that keeps them free of arbitrage.

**One price per asset.** Every asset has one price in the numeraire (CONVERT_NUMERAIRE, PHP by
default); a market's price is the ratio of its two assets' prices, and a pair's is that ratio or its
inverse. Whatever the prices are, the market prices of any cycle of conversions (PHP -> USDT -> BTC
-> PHP, or any other) multiply to exactly 1 at any one moment, and the house's spread, taken on each
leg, makes every cycle return less than it started with. Markets that walked independently (each its
own random walk) let a customer turn 300,000 PHP into 300,379.69 by converting round a triangle.

A price source answers `book()`: a `PriceBook` whose `mid(source, target)` is the market's price in
that direction (target units per one source unit, before the spread) and when it was confirmed. The
default, `ReferencePrices`, reads the `AssetPrice` rows operators keep in the admin (an `AssetBook`);
its `tick()` (a periodic job, `convert.market_tick`, every CONVERT_MARKET_TICK_SECONDS) moves each
asset's price by a bounded random walk around the operators' anchor and confirms it, all in one
transaction, so quotes really change over time and a book is always read whole. A real feed plugs in
by setting CONVERT_PRICE_SOURCE to the dotted path of a class with the same two methods; it should
return an `AssetBook` (one price per asset) too. A feed that only has prices per market may return a
`MarketBook`, whose prices need not be consistent: that is what the guard is for.

**The guard** (`check_no_arbitrage`): before any quote or accept, the customers' prices of every
enabled pair (after spread and fee) are checked for a cycle that returns more than
CONVERT_ARBITRAGE_TOLERANCE_BPS (default 0) above 1. While one exists, nothing is quoted or accepted
("failed to fetch liquidity, try again later") and an error is logged once per book: a faulty feed
stops convert instead of paying customers to go round in circles.

The service never quotes on a price older than CONVERT_PRICE_MAX_AGE_SECONDS: it refuses instead.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal, localcontext
from functools import lru_cache
from typing import Protocol

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from accounts.ledger.posting import fetch_prepared
from accounts.models import Asset
from convert.errors import LiquidityUnavailable
from convert.models import AssetPrice, Pair
from exchange.runtime.ttlcache import ReferenceCache

logger = logging.getLogger(__name__)

BPS = Decimal(10000)
PRICE_DIGITS = 12  # significant digits of a quoted price


@dataclass(frozen=True)
class MarketPrice:
    price: Decimal  # target units per one source unit, before the spread
    as_of: datetime | None  # None: always current (the numeraire against itself)


class PriceBook(Protocol):
    def mid(self, source: str, target: str) -> MarketPrice | None: ...

    def key(self) -> Hashable: ...


class PriceSource(Protocol):
    def book(self) -> PriceBook: ...

    def tick(self) -> int: ...


def _older(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return min(a, b)


@dataclass(frozen=True)
class AssetBook:
    """Each asset's price in the numeraire (code -> (price, confirmed at)); the numeraire is 1."""

    numeraire: str
    prices: dict[str, tuple[Decimal, datetime]] = field(default_factory=dict)

    def _of(self, code: str) -> tuple[Decimal, datetime | None] | None:
        if code == self.numeraire:
            return Decimal(1), None
        found = self.prices.get(code)
        if found is None or not found[0] > 0:
            return None
        return found

    def mid(self, source: str, target: str) -> MarketPrice | None:
        paid, got = self._of(source), self._of(target)
        if paid is None or got is None:
            return None
        with localcontext(prec=60):
            return MarketPrice(paid[0] / got[0], _older(paid[1], got[1]))

    def key(self) -> Hashable:
        return (self.numeraire, tuple(sorted((code, price) for code, (price, _) in self.prices.items())))


@dataclass(frozen=True)
class MarketBook:
    """Prices per market as a feed gives them ((base, quote) -> (quote units per base, confirmed at)),
    not necessarily consistent with each other: the guard refuses to quote on a book whose prices
    admit a profitable cycle."""

    markets: dict[tuple[str, str], tuple[Decimal, datetime]] = field(default_factory=dict)

    def mid(self, source: str, target: str) -> MarketPrice | None:
        direct = self.markets.get((source, target))
        if direct is not None and direct[0] > 0:
            return MarketPrice(direct[0], direct[1])
        inverse = self.markets.get((target, source))
        if inverse is not None and inverse[0] > 0:
            with localcontext(prec=60):
                return MarketPrice(Decimal(1) / inverse[0], inverse[1])
        return None

    def key(self) -> Hashable:
        return tuple(sorted((pair, price) for pair, (price, _) in self.markets.items()))


_BOOK_STATEMENT = (
    "SELECT a.code, p.price, p.price_updated_at"  # noqa: S608 - constant text: the models' own tables
    f" FROM {AssetPrice._meta.db_table} p JOIN {Asset._meta.db_table} a ON a.id = p.asset_id"
)


class ReferencePrices:
    """Operators' reference prices (one AssetPrice per asset), moved by a simulated market."""

    def __init__(self, rng: random.Random | None = None):
        self.rng = rng or random.Random()  # noqa: S311 (a simulated market, not a secret)

    def book(self) -> AssetBook:
        if connection.vendor == "postgresql":  # read by every quote and accept: one prepared statement
            rows = fetch_prepared(_BOOK_STATEMENT, [])
        else:  # SQLite (the embedded mode): the ORM converts its values
            rows = AssetPrice.objects.values_list("asset__code", "price", "price_updated_at")
        return AssetBook(settings.CONVERT_NUMERAIRE, {code: (price, at) for code, price, at in rows})

    def tick(self) -> int:
        """Move every asset's price by at most its step, within its band around the anchor, and
        confirm it: one transaction, so a book is never read half moved."""
        now = timezone.now()
        moved = 0
        with transaction.atomic():
            for row in AssetPrice.objects.select_for_update().order_by("pk"):
                row.price = walk(row, self.rng)
                row.price_updated_at = now
                row.save(update_fields=["price", "price_updated_at"])
                moved += 1
        return moved


def walk(row: AssetPrice, rng: random.Random) -> Decimal:
    """One step of the bounded random walk (whole hundredths of a basis point; no float)."""
    with localcontext(prec=60):
        step = Decimal(rng.randint(-row.walk_step_bps * 100, row.walk_step_bps * 100)) / (BPS * 100)
        band = Decimal(row.walk_band_bps) / BPS
        low, high = row.anchor_price * (1 - band), row.anchor_price * (1 + band)
        price = min(max(row.price * (1 + step), low), high)
        return price.quantize(Decimal("1e-18"))


@lru_cache(maxsize=1)
def _source_for(path: str) -> PriceSource:
    return import_string(path)()


def source() -> PriceSource:
    return _source_for(settings.CONVERT_PRICE_SOURCE)


def customer_price(market_price: Decimal, spread_bps: int) -> Decimal:
    """Target units per source unit the customer gets: the market's less the spread, rounded down
    to PRICE_DIGITS significant digits (and at most 18 places). Twelve digits are more than any
    price needs, and every database keeps them exactly (SQLite, the embedded mode, stores decimals
    as 15-digit floats)."""
    with localcontext(prec=60):
        price = market_price * (1 - Decimal(spread_bps) / BPS)
        if price <= 0:
            return Decimal(0)
        places = min(18, PRICE_DIGITS - 1 - price.adjusted())
        return price.quantize(Decimal(1).scaleb(-places), rounding=ROUND_FLOOR)


# --- the guard ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """A cycle of conversions through `start` and what it returns per unit (1 = break even):
    `ratio` along `path`, and `bound`, the most any cycle through `start` can return (at least
    `ratio`; the guard decides on it)."""

    start: str
    ratio: Decimal
    bound: Decimal
    path: tuple[str, ...]

    @property
    def gain_bps(self) -> Decimal:
        return ((self.ratio - 1) * BPS).quantize(Decimal("0.01"), rounding=ROUND_FLOOR)


def best_cycle(rates: dict[tuple[str, str], Decimal]) -> Cycle | None:
    """The most a customer can end with, per unit started with, by converting round a cycle along
    `rates` ((source, target) -> target units per source unit, what the customer gets after spread
    and fee): Floyd-Warshall on products. The bound is exact when no cycle gains; when one does it
    may overstate the gain (a gaining cycle can be gone round twice), which only makes the guard
    stricter; `ratio` and `path` are a real cycle. None when there is no cycle at all."""
    assets = sorted({code for edge in rates for code in edge})
    index = {code: i for i, code in enumerate(assets)}
    n = len(assets)
    best: list[list[Decimal | None]] = [[None] * n for _ in range(n)]
    after: list[list[int | None]] = [[None] * n for _ in range(n)]  # the next asset on the best path
    for (paid, got), rate in rates.items():
        i, j = index[paid], index[got]
        if rate > 0 and (best[i][j] is None or rate > best[i][j]):
            best[i][j], after[i][j] = rate, j
    edge = {(index[a], index[b]): best[index[a]][index[b]] for a, b in rates}
    with localcontext(prec=60):
        for k in range(n):
            for i in range(n):
                through = best[i][k]
                if through is None:
                    continue
                for j in range(n):
                    onward = best[k][j]
                    if onward is None:
                        continue
                    candidate = through * onward
                    if best[i][j] is None or candidate > best[i][j]:
                        best[i][j], after[i][j] = candidate, after[i][k]
        found = None
        for i in range(n):
            bound = best[i][i]
            if bound is None or (found is not None and bound <= found.bound):
                continue
            path, ratio, at = [i], Decimal(1), i
            while len(path) <= n:
                step = after[at][i]
                if step is None or (at, step) not in edge:
                    break
                ratio *= edge[(at, step)]
                path.append(step)
                at = step
                if at == i:
                    break
            if path[-1] != i:  # the best path could not be retraced: report the bound
                ratio = bound
            found = Cycle(assets[i], ratio, bound, tuple(assets[p] for p in path))
    return found


def customer_rates(book: PriceBook, pairs: Iterable[Pair]) -> dict[tuple[str, str], Decimal]:
    """What a customer gets per unit on each enabled pair at `book`'s prices: the quoted price
    (spread taken, rounded down) less the pair's fee. Pairs without a price are left out."""
    rates = {}
    with localcontext(prec=60):
        for pair in pairs:
            mid = book.mid(pair.source.code, pair.target.code)
            if mid is None or not mid.price > 0:
                continue
            rate = customer_price(mid.price, pair.market.spread_bps) * (1 - Decimal(pair.fee_bps) / BPS)
            rates[(pair.source.code, pair.target.code)] = rate
    return rates


_verdicts: dict[Hashable, Cycle | None] = {}
_verdicts_lock = threading.Lock()


def check_no_arbitrage(book: PriceBook, pairs: Iterable[Pair]) -> None:
    """Refuse (LiquidityUnavailable) while the customers' prices of the enabled pairs admit a cycle
    returning more than CONVERT_ARBITRAGE_TOLERANCE_BPS above 1; log it as an error once per book.
    The verdict is remembered per book and pair settings (a book changes once a tick)."""
    tolerance = Decimal(settings.CONVERT_ARBITRAGE_TOLERANCE_BPS) / BPS
    key = (
        book.key(),
        tuple((p.source.code, p.target.code, p.market.spread_bps, p.fee_bps) for p in pairs),
        tolerance,
    )
    with _verdicts_lock:
        known = key in _verdicts
        verdict = _verdicts.get(key)
    if not known:
        cycle = best_cycle(customer_rates(book, pairs))
        verdict = cycle if cycle is not None and cycle.bound > 1 + tolerance else None
        if verdict is not None:
            logger.error(
                "Convert prices admit arbitrage: %s returns %s bps; quoting stopped until the prices are fixed",
                " -> ".join(verdict.path),
                verdict.gain_bps,
            )
        with _verdicts_lock:
            if len(_verdicts) > 64:
                _verdicts.clear()
            _verdicts[key] = verdict
    if verdict is not None:
        raise LiquidityUnavailable()


@dataclass(frozen=True)
class EnabledPairs:
    """The enabled pairs with their assets and markets, and two indexes of them. Shared by every
    request of the process: read, never changed (a change is a new load)."""

    pairs: tuple[Pair, ...]
    by_direction: dict[tuple[str, str], Pair]
    by_id: dict[int, Pair]


# Read by every quote and accept: cached per process; a change of a pair, market or asset reaches
# every process within REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py, convert/apps.py).
_enabled = ReferenceCache("convert pairs")


def _load_enabled() -> EnabledPairs:
    pairs = tuple(Pair.objects.select_related("source", "target", "market").filter(enabled=True).order_by("pk"))
    return EnabledPairs(pairs, {(p.source.code, p.target.code): p for p in pairs}, {p.pk: p for p in pairs})


def enabled_pairs() -> EnabledPairs:
    return _enabled.get("enabled", _load_enabled)


def pairs_in_play() -> tuple[Pair, ...]:
    """The enabled pairs with what the guard needs (assets, the market's spread)."""
    return enabled_pairs().pairs


def current_price(pair: Pair, pairs: Iterable[Pair] | None = None) -> MarketPrice:
    """The pair's market price, or LiquidityUnavailable when there is none, it is stale, or the
    book it comes from admits arbitrage. `pairs`: the enabled pairs, when the caller has them."""
    book = source().book()
    check_no_arbitrage(book, pairs if pairs is not None else pairs_in_play())
    found = book.mid(pair.source.code, pair.target.code)
    max_age = timedelta(seconds=settings.CONVERT_PRICE_MAX_AGE_SECONDS)
    if found is None or found.price <= 0:
        raise LiquidityUnavailable()
    if found.as_of is not None and timezone.now() - found.as_of > max_age:
        raise LiquidityUnavailable()
    return found
