"""A seeded random run of 10,000 quote / accept / expire operations at the service level
(convert.services) over five customers and every pair, with failures injected along the way:
liquidity drained (one shard, or the whole house in an asset) and topped up again, the CONVERT
business status flipped, asset prices moved well beyond the last-look tolerance, quotes expired,
quotes accepted by someone else or twice.

A model kept here predicts every outcome (from the customers' and the house's balances, the
business status, the market levels and the quotes' expiry) and the run checks each against it.
At the end: every SUCCESS order has exactly one CONVERT posting with the order's amounts, every
FAILED order none, each customer's balances equal their funding plus their orders' legs (and the
model's), the house and the fees account agree with the model, and the ledger check passes."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from accounts.ledger.models import BusinessType, Entry, Posting
from convert import errors, services
from convert.models import AssetPrice, Order, OrderStatus, Pair, Quote
from exchange.platform.services import business_status_set
from tests.convert.helpers import (
    ACCOUNT,
    EXPIRED,
    INSUFFICIENT,
    LIQUIDITY,
    NOT_FOUND,
    PRICE_CHANGED,
    SUSPENDED,
    USED,
    asset_price,
    drain,
    fees_account,
    fees_total,
    free,
    house_total,
    market_price,
    shards,
)
from tests.support.assertions import assert_ledger_balanced
from tests.support.factories import UserFactory, fund
from tests.support.staff import TREASURY, staff_member

SEED = 20261124
OPERATIONS = 10_000
CUSTOMERS = 5
CODES = ("BTC", "ETH", "USDT", "PHP")
PLACES = {"BTC": 8, "ETH": 8, "USDT": 6, "PHP": 2}
FUNDING = {"BTC": Decimal(1), "ETH": Decimal(15), "USDT": Decimal(50_000), "PHP": Decimal(3_000_000)}
# the source amounts the run converts (within every pair's bounds)
SOURCE_RANGE = {
    "BTC": (Decimal("0.0001"), Decimal("0.2")),
    "ETH": (Decimal("0.001"), Decimal(3)),
    "USDT": (Decimal(1), Decimal(10_000)),
    "PHP": (Decimal(50), Decimal(600_000)),
}
# asset price moves of 300 bp (an accept is refused when its market fell by more than the spread)
LEVELS = {-1: Decimal("0.97"), 0: Decimal(1), 1: Decimal("1.03")}
FEES_BPS = {("BTC", "PHP"): 10, ("USDT", "ETH"): 30}


@dataclass
class Pending:
    quote_id: str
    owner: int
    pair: Pair
    source: Decimal
    target: Decimal
    fee: Decimal
    level: Decimal  # the pair's market price when quoted, relative to the start (from the assets' levels)
    expired: bool = False


def _amount(rng: random.Random, low: Decimal, high: Decimal, places: int) -> Decimal:
    unit = Decimal(1).scaleb(-places)
    return Decimal(rng.randint(int(low / unit), int(high / unit))) * unit


def _relative_mid(pair: Pair, level: dict[str, int]) -> Decimal:
    """The pair's market price relative to the start: the source's level over the target's (the
    numeraire, PHP, never moves)."""
    return LEVELS[level.get(pair.source.code, 0)] / LEVELS[level.get(pair.target.code, 0)]


def _against_the_house(pair: Pair, quoted: Decimal, now: Decimal) -> bool:
    """The pair's market fell since the quote by more than its spread (or the last-look tolerance):
    the house would pay more than the market's price now. Moves are 0 or 9 bp (1 / 1.03 against
    0.97) or at least 291 bp, far from either bound."""
    bound = min(pair.market.spread_bps, 50)
    return now < quoted * (1 - Decimal(bound) / 10000)


@pytest.mark.django_db(transaction=True)  # committed for real, as in production (and the shard ids cached)
def test_ten_thousand_random_operations(convert_world, settings):
    settings.QUOTE_TTL_SECONDS = 3600  # quotes expire only when the run expires them
    settings.CONVERT_PRICE_MAX_AGE_SECONDS = 3600  # prices are confirmed by the run, not a beat
    settings.CONVERT_LAST_LOOK_TOLERANCE_BPS = 50
    for (source, target), bps in FEES_BPS.items():
        Pair.objects.filter(source__code=source, target__code=target).update(fee_bps=bps)
    with connection.cursor() as cursor:  # this run's commits need not wait for the disk (a test database)
        cursor.execute("SET synchronous_commit TO OFF")
    rng = random.Random(SEED)
    users = [UserFactory() for _ in range(CUSTOMERS)]
    treasurer = staff_member(TREASURY)  # tops the house up (the service checks the permission)
    for user in users:
        for code, amount in FUNDING.items():
            fund(user, code, amount)
    pairs = list(Pair.objects.select_related("source", "target", "market").order_by("pk"))
    anchors = {code: asset_price(code) for code in CODES if code != "PHP"}
    # target ranges for targetAmount quotes: inside the source range at any level, with a margin
    target_range = {}
    for pair in pairs:
        low, high = SOURCE_RANGE[pair.source.code]
        price = market_price(pair.source.code, pair.target.code)
        target_range[pair.pk] = (low * price * Decimal("1.1"), high * price * Decimal("0.9"))

    # the model
    balance = {(i, code): FUNDING[code] for i in range(CUSTOMERS) for code in CODES}
    house = {code: house_total(code) for code in CODES}
    fees = {code: fees_total(code) for code in CODES}
    level = dict.fromkeys(anchors, 0)
    business_on = True
    pending: list[Pending] = []
    used: list[tuple[str, int]] = []  # (quote id, owner)
    outcomes: Counter = Counter()
    predicted_orders: dict[str, str] = {}  # quote id -> "SUCCESS" or the FAILED order's message

    def expect_refusal(call, message: str) -> None:
        with pytest.raises(errors.ConvertError) as raised:
            call()
        assert raised.value.msg == message, (raised.value.msg, message)

    started = time.monotonic()
    for _ in range(OPERATIONS):
        roll = rng.random()
        if not business_on and rng.random() < 0.06:  # --- operators turn CONVERT back on (soon)
            business_on = True
            business_status_set(business_type="CONVERT", is_on=True)
            outcomes["inject: business on"] += 1
        elif roll < 0.44 or not pending:  # --- quote
            i = rng.randrange(CUSTOMERS)
            pair = rng.choice(pairs)
            if rng.random() < 0.7:
                low, high = SOURCE_RANGE[pair.source.code]
                amounts = {"source_amount": _amount(rng, low, high, PLACES[pair.source.code])}
            else:
                low, high = target_range[pair.pk]
                amounts = {"target_amount": _amount(rng, low, high, pair.precision)}
            create = lambda i=i, pair=pair, amounts=amounts: services.quote_create(  # noqa: E731
                user=users[i], source_code=pair.source.code, target_code=pair.target.code, **amounts
            )
            if not business_on:
                expect_refusal(create, SUSPENDED)
                outcomes["quote refused: suspended"] += 1
                continue
            q = create()
            quoted_at = _relative_mid(pair, level)
            pending.append(Pending(q.quote_id, i, pair, q.source_amount, q.target_amount, q.fee, quoted_at))
            outcomes["quote"] += 1
        elif roll < 0.84:  # --- accept
            p = pending.pop(rng.randrange(len(pending)))
            if rng.random() < 0.03:  # someone else's quote: not found, and still the owner's to accept
                other = (p.owner + 1 + rng.randrange(CUSTOMERS - 1)) % CUSTOMERS
                expect_refusal(lambda: services.quote_accept(user=users[other], quote_id=p.quote_id), NOT_FOUND)  # noqa: B023
                pending.append(p)
                outcomes["accept refused: not the owner"] += 1
                continue
            pair, src, tgt = p.pair, p.pair.source.code, p.pair.target.code
            if p.expired:
                expected = EXPIRED
            elif not business_on:
                expected = SUSPENDED
            elif _against_the_house(pair, p.level, _relative_mid(pair, level)):
                expected = PRICE_CHANGED
            elif balance[(p.owner, src)] < p.source:
                expected = INSUFFICIENT
            elif house[tgt] < p.target + p.fee:
                expected = LIQUIDITY
            else:
                expected = "SUCCESS"
            accept = lambda p=p: services.quote_accept(user=users[p.owner], quote_id=p.quote_id)  # noqa: E731
            if expected == "SUCCESS":
                order = accept()
                assert order.status == OrderStatus.SUCCESS
                balance[(p.owner, src)] -= p.source
                balance[(p.owner, tgt)] += p.target
                house[src] += p.source
                house[tgt] -= p.target + p.fee
                fees[tgt] += p.fee
            else:
                expect_refusal(accept, expected)
            predicted_orders[p.quote_id] = expected
            used.append((p.quote_id, p.owner))
            outcomes[f"accept: {expected}"] += 1
        elif roll < 0.92:  # --- expire a pending quote
            p = rng.choice(pending)
            Quote.objects.filter(quote_id=p.quote_id).update(expires_at=timezone.now() - timedelta(seconds=1))
            p.expired = True
            outcomes["expire"] += 1
        elif roll < 0.94 and used:  # --- accept a spent quote again
            qid, owner = rng.choice(used)
            expect_refusal(lambda: services.quote_accept(user=users[owner], quote_id=qid), USED)  # noqa: B023
            outcomes["accept refused: used"] += 1
        elif roll < 0.955:  # --- drain liquidity: one shard, or the whole house, of one asset
            code = rng.choice(CODES)
            drain(*([rng.choice(shards())] if rng.random() < 0.5 else shards()), code=code)
            house[code] = house_total(code)
            outcomes["inject: drain"] += 1
        elif roll < 0.97:  # --- top the house up again, through the admin's service
            code = rng.choice(CODES)
            amount = SOURCE_RANGE[code][1] * rng.randint(5, 60)
            services.liquidity_top_up(asset_code=code, amount=amount, actor=treasurer, reason="simulation")
            house[code] += amount
            outcomes["inject: top-up"] += 1
        elif roll < 0.98:  # --- operators turn CONVERT off
            business_on = False
            business_status_set(business_type="CONVERT", is_on=False)
            outcomes["inject: business off"] += 1
        else:  # --- an asset's price moves 3% (or back): every market of the asset with it
            code = rng.choice(sorted(anchors))
            level[code] = rng.choice([lv for lv in LEVELS if lv != level[code]])
            AssetPrice.objects.filter(asset__code=code).update(
                price=anchors[code] * LEVELS[level[code]], price_updated_at=timezone.now()
            )
            outcomes["inject: price moved"] += 1
    elapsed = time.monotonic() - started

    # every kind of operation and failure really happened
    for kind in (
        "quote",
        "expire",
        "accept: SUCCESS",
        f"accept: {EXPIRED}",
        f"accept: {SUSPENDED}",
        f"accept: {PRICE_CHANGED}",
        f"accept: {INSUFFICIENT}",
        f"accept: {LIQUIDITY}",
        "accept refused: not the owner",
        "accept refused: used",
        "quote refused: suspended",
    ):
        assert outcomes[kind] >= 20, (kind, outcomes)
    assert outcomes[f"accept: {ACCOUNT}"] == 0
    assert sum(outcomes.values()) >= OPERATIONS * 0.95, outcomes

    # the orders are what the model predicted, one per accepted quote
    orders = list(Order.objects.select_related("quote", "pair__source", "pair__target"))
    assert len(orders) == len(predicted_orders)
    for order in orders:
        predicted = predicted_orders[order.quote.quote_id]
        if predicted == "SUCCESS":
            assert (order.status, order.error_code, order.error_message) == ("SUCCESS", "", "")
            assert order.posting_id is not None
        else:
            assert (order.status, order.error_code, order.error_message) == ("FAILED", "10000003", predicted)
            assert order.posting_id is None
        q = order.quote
        assert (order.source_amount, order.target_amount, order.fee) == (q.source_amount, q.target_amount, q.fee)

    # every SUCCESS order has exactly one CONVERT posting with its amounts; FAILED ones none
    successes = {o.posting_id: o for o in orders if o.status == OrderStatus.SUCCESS}
    postings = dict(Posting.objects.filter(kind=BusinessType.CONVERT).values_list("pk", "reference"))
    assert set(postings) == set(successes)
    assert sorted(postings.values()) == sorted(f"convert:{o.quote.quote_id}" for o in successes.values())
    house_ids = set(shards())
    fees_of = {user.pk: fees_account(user) for user in users}  # each customer's fees shard
    legs: dict[int, dict[tuple[str, str], Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for posting_id, account_id, code, side, amount in Entry.objects.filter(posting_id__in=postings).values_list(
        "posting_id", "account_id", "asset__code", "side", "amount"
    ):
        fees_id = fees_of[successes[posting_id].user_id]
        who = "house" if account_id in house_ids else "fees" if account_id == fees_id else account_id
        legs[posting_id][(who, code)] += side * amount
    for posting_id, order in successes.items():
        src, tgt = order.pair.source.code, order.pair.target.code
        expected = {
            (order.user_id, src): -order.source_amount,
            ("house", src): order.source_amount,
            (order.user_id, tgt): order.target_amount,
            ("house", tgt): -(order.target_amount + order.fee),
        }
        if order.fee:
            expected[("fees", tgt)] = order.fee
        assert dict(legs[posting_id]) == expected, (order.pk, dict(legs[posting_id]))

    # balances: funding plus the orders' legs, and the model's
    for i, user in enumerate(users):
        expected = dict(FUNDING)
        for order in orders:
            if order.user_id == user.pk and order.status == OrderStatus.SUCCESS:
                expected[order.pair.source.code] -= order.source_amount
                expected[order.pair.target.code] += order.target_amount
        for code in CODES:
            assert free(user.pk, code) == expected[code] == balance[(i, code)], (i, code)
    for code in CODES:
        assert house_total(code) == house[code], code
        assert fees_total(code) == fees[code], code
    assert_ledger_balanced()
    print(f"\n{OPERATIONS} operations in {elapsed:.1f}s: {dict(sorted(outcomes.items()))}")  # noqa: T201
