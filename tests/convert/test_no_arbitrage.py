"""No cycle of conversions returns more than it started with (issue 25, finding 1).

- The review's reproduction, through the API: the simulated market ticks (each tick moved every
  market on its own walk before, so cross prices drifted apart) and after each tick the customer
  converts PHP -> USDT -> BTC -> PHP and back round the other way; every cycle ends with less PHP.
- A property test (hypothesis): random walks of the asset prices, random spreads and fees, random
  cycles of every length through the enabled pairs, random amounts; each leg quoted with the
  service's own pricing and rounding at one book; the cycle never ends above its start, and the
  guard's best cycle of customer rates never exceeds 1.
- The guard: a feed whose market prices are inconsistent gets no quote and no accept (LIQUIDITY),
  and an error names the cycle; a consistent feed quotes.
"""

from __future__ import annotations

import logging
import random
from decimal import Decimal

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from convert import errors, prices, services
from convert.models import AssetPrice, Market, Pair
from tests.convert.helpers import LIQUIDITY, accept, free, ok, quote, refused
from tests.support.factories import customer

# --- the review's reproduction, through the API ---------------------------------------------------------


def _cycle(client, legs: list[tuple[str, str]], amount: Decimal) -> Decimal:
    """Convert `amount` round `legs`, each leg's source the previous leg's target; what came back."""
    for source, target in legs:
        data = ok(quote(client, source, target, source_amount=amount))
        assert ok(accept(client, data["quoteId"]))["status"] == "SUCCESS"
        amount = Decimal(data["targetAmount"])
    return amount


def test_converting_round_a_triangle_never_makes_money(convert_world, settings):
    """With every market walking on its own this made money in most ticks (300,000.00 PHP became
    300,379.69): big steps here, so the cross prices would drift apart within a few ticks."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 100_000
    AssetPrice.objects.update(walk_step_bps=40, walk_band_bps=800)
    alice = customer(funding={"PHP": "1000000"})
    source = prices.ReferencePrices(rng=random.Random(25))
    start = Decimal("300000.00")
    returns = []
    for _ in range(12):
        source.tick()
        for legs in (
            [("PHP", "USDT"), ("USDT", "BTC"), ("BTC", "PHP")],
            [("PHP", "BTC"), ("BTC", "USDT"), ("USDT", "PHP")],
        ):
            before = free(alice.user.pk, "PHP")
            back = _cycle(alice.client, legs, start)
            assert free(alice.user.pk, "PHP") == before - start + back
            returns.append(back)
    assert all(back < start for back in returns), [str(b) for b in returns]
    # the spreads (15 + 20 + 20 bp) are what a cycle costs, give or take the rounding
    assert all(start * Decimal("0.9940") < back for back in returns), [str(b) for b in returns]


# --- the property ----------------------------------------------------------------------------------------


def _closed_walks(pairs: list[Pair], start: str, length: int, rng: random.Random) -> list[Pair] | None:
    """A random cycle of `length` conversions from `start` back to `start` along `pairs`."""
    by_source: dict[str, list[Pair]] = {}
    for pair in pairs:
        by_source.setdefault(pair.source.code, []).append(pair)
    for _ in range(50):
        at, path = start, []
        for _ in range(length - 1):
            pair = rng.choice(by_source[at])
            path.append(pair)
            at = pair.target.code
        last = [p for p in by_source[at] if p.target.code == start]
        if last:
            return [*path, last[0]]
    return None


@pytest.fixture
def world(convert_world):
    return {"pairs": prices.pairs_in_play(), "rows": list(AssetPrice.objects.select_related("asset"))}


@hypothesis_settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    ticks=st.integers(min_value=0, max_value=200),
    step_bps=st.integers(min_value=0, max_value=200),
    spreads=st.lists(st.integers(min_value=0, max_value=40), min_size=4, max_size=4),
    fees=st.lists(st.integers(min_value=0, max_value=30), min_size=8, max_size=8),
    start=st.sampled_from(["PHP", "USDT", "BTC", "ETH"]),
    length=st.integers(min_value=2, max_value=7),
    value_php=st.decimals(min_value=1000, max_value=2_000_000, places=2),
)
def test_no_cycle_of_any_length_profits(world, seed, ticks, step_bps, spreads, fees, start, length, value_php):
    rng = random.Random(seed)
    rows = world["rows"]
    for row in rows:  # each example walks from the anchors, with the simulated market's own step
        row.price, row.walk_step_bps, row.walk_band_bps = row.anchor_price, step_bps, 2000
    for _ in range(ticks):
        for row in rows:
            row.price = prices.walk(row, rng)
    now = timezone.now()
    book = prices.AssetBook("PHP", {row.asset.code: (row.price, now) for row in rows})
    pairs = world["pairs"]
    spread_of = dict(zip(sorted({p.market_id for p in pairs}), spreads, strict=True))
    for pair, fee in zip(pairs, fees, strict=True):
        pair.market.spread_bps = spread_of[pair.market_id]
        pair.fee_bps = fee

    # the guard's view: the best cycle of customer rates, however long, never gains
    best = prices.best_cycle(prices.customer_rates(book, pairs))
    assert best is not None
    assert best.bound <= 1, best

    # the service's own quotes at this one book, round a random cycle
    path = _closed_walks(pairs, start, length, rng)
    if path is None:  # no cycle of that length back to `start` (cannot happen with the demo's pairs)
        return
    places = path[0].source.transfer_precision
    amount = (value_php / book.mid(start, "PHP").price).quantize(Decimal(1).scaleb(-places))
    started = amount
    for pair in path:
        price = prices.customer_price(book.mid(pair.source.code, pair.target.code).price, pair.market.spread_bps)
        try:
            _, amount, _ = services.quote_amounts(pair, price, source_amount=amount, target_amount=None)
        except errors.AmountRefused:  # out of the pair's bounds after a long walk: no cycle to make
            return
    assert amount <= started, ([str(p) for p in path], started, amount)


# --- the guard -------------------------------------------------------------------------------------------


class FeedWithBrokenCross:
    """A feed quoting BTC/USDT 1% above what BTC/PHP and USDT/PHP imply: PHP -> USDT -> BTC -> PHP
    gains ~0.45% after three 15-20 bp spreads."""

    def book(self) -> prices.MarketBook:
        at = timezone.now()
        implied = Decimal("5200000") / Decimal("58.20")
        return prices.MarketBook(
            {
                ("BTC", "PHP"): (Decimal("5200000"), at),
                ("USDT", "PHP"): (Decimal("58.20"), at),
                ("ETH", "USDT"): (Decimal("3100"), at),
                ("BTC", "USDT"): (implied * Decimal("0.99"), at),
            }
        )

    def tick(self) -> int:
        return 0


class FeedConsistent(FeedWithBrokenCross):
    def book(self) -> prices.MarketBook:
        at = timezone.now()
        return prices.MarketBook(
            {
                ("BTC", "PHP"): (Decimal("5200000"), at),
                ("USDT", "PHP"): (Decimal("58.20"), at),
                ("ETH", "USDT"): (Decimal("3100"), at),
                ("BTC", "USDT"): (Decimal("5200000") / Decimal("58.20"), at),
            }
        )


def test_the_guard_refuses_to_quote_on_prices_that_admit_arbitrage(convert_world, settings, caplog):
    alice = customer(funding={"PHP": "1000000", "BTC": "1"})
    settings.CONVERT_PRICE_SOURCE = "tests.convert.test_no_arbitrage.FeedConsistent"
    qid = ok(quote(alice.client, "PHP", "USDT", source_amount="100000"))["quoteId"]

    settings.CONVERT_PRICE_SOURCE = "tests.convert.test_no_arbitrage.FeedWithBrokenCross"
    with caplog.at_level(logging.ERROR, logger="convert.prices"):
        for source, target in (("PHP", "USDT"), ("USDT", "BTC"), ("BTC", "PHP"), ("ETH", "USDT")):
            refused(quote(alice.client, source, target, source_amount="1" if source == "BTC" else "1000"), LIQUIDITY)
        refused(accept(alice.client, qid), LIQUIDITY)  # a quote made before is not accepted either
    alerts = [r.getMessage() for r in caplog.records if "admit arbitrage" in r.getMessage()]
    assert len(alerts) == 1, alerts  # once per book, not once per request
    assert all(code in alerts[0] for code in ("BTC", "USDT", "PHP")), alerts
    assert free(alice.user.pk, "PHP") == Decimal("1000000")

    settings.CONVERT_PRICE_SOURCE = "tests.convert.test_no_arbitrage.FeedConsistent"
    ok(quote(alice.client, "USDT", "BTC", source_amount="10"))


def test_the_tolerance_lets_an_operator_accept_a_small_inconsistency(convert_world, settings):
    alice = customer(funding={"PHP": "1000000"})
    settings.CONVERT_PRICE_SOURCE = "tests.convert.test_no_arbitrage.FeedWithBrokenCross"
    refused(quote(alice.client, "PHP", "USDT", source_amount="1000"), LIQUIDITY)
    settings.CONVERT_ARBITRAGE_TOLERANCE_BPS = 100
    ok(quote(alice.client, "PHP", "USDT", source_amount="1000"))


def test_best_cycle_finds_the_gaining_triangle():
    rates = {
        ("PHP", "USDT"): Decimal(1) / Decimal(58),
        ("USDT", "BTC"): Decimal(1) / Decimal(88000),
        ("BTC", "PHP"): Decimal(5200000),
        ("PHP", "BTC"): Decimal(1) / Decimal(5300000),
    }
    found = prices.best_cycle(rates)
    assert found is not None
    assert abs(found.ratio - Decimal(5200000) / (58 * 88000)) < Decimal("1e-40")
    assert found.bound >= found.ratio
    assert found.gain_bps == Decimal("188.08")
    assert set(found.path) == {"PHP", "USDT", "BTC"}
    assert found.path[0] == found.path[-1]
    assert prices.best_cycle({("PHP", "USDT"): Decimal("0.017")}) is None  # no way back: no cycle


def test_an_asset_book_is_consistent_by_construction(convert_world):
    book = prices.source().book()
    codes = ["PHP", "USDT", "BTC", "ETH"]
    for a in codes:
        for b in codes:
            for c in codes:
                if len({a, b, c}) == 3:
                    product = book.mid(a, b).price * book.mid(b, c).price * book.mid(c, a).price
                    assert abs(product - 1) < Decimal("1e-50")
    # the markets are priced from the assets: BTC/USDT is BTC's price over USDT's
    assert Market.objects.filter(base__code="BTC", quote__code="USDT").exists()
    assert book.mid("BTC", "USDT").price == Decimal("5200000") / Decimal("58.20")
