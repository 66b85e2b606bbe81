"""The simulated market (convert.prices.ReferencePrices.tick): a bounded random walk of each asset's
price in the numeraire around its anchor, at most walk_step_bps per tick, confirming the price;
walk_step_bps=0 keeps the anchor; the periodic task runs it; a confirmed price makes a stale market
quotable again."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from convert import prices, tasks
from convert.models import AssetPrice
from tests.convert.helpers import LIQUIDITY, ok, quote, refused
from tests.support.factories import customer

TICKS = 300


def _prices() -> dict[int, Decimal]:
    return dict(AssetPrice.objects.values_list("pk", "price"))


def test_the_walk_stays_in_its_band_and_steps(convert_world):
    AssetPrice.objects.update(walk_step_bps=25, walk_band_bps=100)  # big steps: the band is reached
    markets = {m.pk: m for m in AssetPrice.objects.all()}
    source = prices.ReferencePrices(rng=random.Random(20261124))
    previous = _prices()
    seen_moves, at_edge = 0, 0
    for _ in range(TICKS):
        assert source.tick() == len(markets)
        now = _prices()
        for pk, price in now.items():
            market = markets[pk]
            low = market.anchor_price * (1 - Decimal(market.walk_band_bps) / 10000)
            high = market.anchor_price * (1 + Decimal(market.walk_band_bps) / 10000)
            assert low <= price <= high, (market, price)
            step = abs(price - previous[pk])
            assert step <= previous[pk] * market.walk_step_bps / 10000 + Decimal("1e-18"), (market, previous[pk], price)
            assert price == price.quantize(Decimal("1e-18"))
            seen_moves += price != previous[pk]
            at_edge += price in (low, high)
        previous = now
    assert seen_moves > TICKS * len(markets) * 0.9  # it really moves
    assert at_edge > 0  # and the band really holds it


def test_the_demo_walk_moves_a_little(convert_world):
    source = prices.ReferencePrices(rng=random.Random(7))
    before = _prices()
    for _ in range(50):
        source.tick()
    after = _prices()
    for market in AssetPrice.objects.all():
        assert after[market.pk] != before[market.pk]
        assert abs(after[market.pk] / market.anchor_price - 1) <= Decimal(market.walk_band_bps) / 10000


def test_the_walk_is_reproducible_with_a_seed(convert_world):
    start = _prices()
    runs = []
    for _ in range(2):
        for pk, price in start.items():
            AssetPrice.objects.filter(pk=pk).update(price=price)
        source = prices.ReferencePrices(rng=random.Random(99))
        for _ in range(20):
            source.tick()
        runs.append(_prices())
    assert runs[0] == runs[1]


def test_a_step_of_zero_keeps_the_anchor(convert_world):
    AssetPrice.objects.update(walk_step_bps=0)
    anchors = dict(AssetPrice.objects.values_list("pk", "anchor_price"))
    source = prices.ReferencePrices(rng=random.Random(1))
    for _ in range(20):
        source.tick()
        assert _prices() == anchors


def test_a_tick_confirms_the_price(convert_world, settings):
    alice = customer(funding={"BTC": "1"})
    old = timezone.now() - timedelta(seconds=settings.CONVERT_PRICE_MAX_AGE_SECONDS + 5)
    AssetPrice.objects.update(price_updated_at=old)
    refused(quote(alice.client, "BTC", "PHP", source_amount="0.01"), LIQUIDITY)
    before = timezone.now()
    # the periodic task (Celery beat / embedded scheduler) moves BTC, USDT and ETH (PHP is the numeraire)
    assert tasks.market_tick_task() == 3
    assert all(at >= before for at in AssetPrice.objects.values_list("price_updated_at", flat=True))
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))


def test_quotes_follow_the_market(convert_world):
    alice = customer(funding={"BTC": "1"})
    AssetPrice.objects.update(walk_step_bps=50, walk_band_bps=300)
    source = prices.ReferencePrices(rng=random.Random(3))
    seen = set()
    for _ in range(5):
        source.tick()
        seen.add(ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))["price"])
    assert len(seen) > 1
