"""accept-quote: only the owner, only once, only before expiry; insufficient balance; the house's
liquidity shards (the customer's, then the richest, never a partial move); the last look; the
business status and the account; every refusal kept as a FAILED order with nothing moved."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.ledger.models import BusinessType, Posting
from convert import services
from convert.models import AssetPrice, Order, OrderStatus, Pair, Quote
from exchange.platform.services import business_status_set
from tests.convert.helpers import (
    ACCOUNT,
    EXPIRED,
    HISTORY,
    INSUFFICIENT,
    LIQUIDITY,
    NOT_FOUND,
    PRICE_CHANGED,
    SUSPENDED,
    USED,
    accept,
    drain,
    free,
    market_price,
    ok,
    quote,
    refill,
    refused,
    set_market,
    shard_of,
    shards,
)
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.factories import customer

CODES = ("BTC", "ETH", "USDT", "PHP")


def snapshot(*account_ids: int) -> dict[tuple[int, str], Decimal]:
    """Every asset's free balance of the accounts, the liquidity shards included."""
    ids = set(account_ids) | set(shards())
    return {(account, code): free(account, code) for account in ids for code in CODES}


def quote_id(client, source="BTC", target="PHP", **amount) -> str:
    amount = amount or {"source_amount": "0.01"}
    return ok(quote(client, source, target, **amount))["quoteId"]


def assert_failed_order(quote_id_: str, message: str) -> Order:
    """The refused accept is kept for support: FAILED, errorCode 10000003, the message, no posting."""
    order = Order.objects.get(quote__quote_id=quote_id_)
    assert (order.status, order.error_code, order.error_message) == (OrderStatus.FAILED, "10000003", message)
    assert order.posting_id is None
    assert not Posting.objects.filter(reference=f"convert:{quote_id_}").exists()
    return order


def assert_nothing_moved(before: dict) -> None:
    after = snapshot(*{account for account, _ in before})
    assert after == before
    assert not Posting.objects.filter(kind=BusinessType.CONVERT).exists()
    assert_ledger_balanced()


@pytest.fixture
def alice(convert_world):
    return customer(funding={"BTC": "1", "PHP": "100000", "USDT": "1000"})


@pytest.fixture
def bob(convert_world):
    return customer(funding={"BTC": "1", "PHP": "100000"})


# --- who, how often, how late ----------------------------------------------------------------------


def test_another_accounts_quote_does_not_exist_for_the_caller(alice, bob):
    qid = quote_id(alice.client)
    before = snapshot(alice.user.pk, bob.user.pk)
    refused(accept(bob.client, qid), NOT_FOUND)
    assert_nothing_moved(before)
    assert not Order.objects.exists()  # bob's attempt spends nothing: alice may still accept
    assert ok(accept(alice.client, qid))["status"] == "SUCCESS"
    assert_balance(bob.user, "BTC", "1")
    assert_balance(bob.user, "PHP", "100000")


@pytest.mark.parametrize("unknown", ["0" * 32, "nope", "x" * 64])
def test_an_unknown_quote_does_not_exist(alice, unknown):
    refused(accept(alice.client, unknown), NOT_FOUND)
    assert not Order.objects.exists()


def test_a_missing_quote_id_is_a_gateway_error(alice):
    from tests.support.assertions import assert_error

    assert_error(alice.client.post("/openapi/convert/v1/accept-quote"), -1105, 400)


def test_accepting_twice_moves_money_once(alice):
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    accepted = ok(accept(alice.client, data["quoteId"]))
    assert set(accepted) == {"orderId", "status"}
    assert accepted["status"] == "SUCCESS"
    assert accepted["orderId"] == str(Order.objects.get().pk)
    refused(accept(alice.client, data["quoteId"]), USED)
    refused(accept(alice.client, data["quoteId"]), USED)
    assert_balance(alice.user, "BTC", "0.99")
    assert_balance(alice.user, "PHP", Decimal("100000") + Decimal(data["targetAmount"]))
    assert Order.objects.count() == 1
    assert Posting.objects.filter(kind=BusinessType.CONVERT).count() == 1
    assert_ledger_balanced()


def test_an_expired_quote_is_refused_kept_as_failed_and_spent(alice):
    qid = quote_id(alice.client)
    Quote.objects.filter(quote_id=qid).update(expires_at=timezone.now() - timedelta(milliseconds=1))
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), EXPIRED)
    order = assert_failed_order(qid, EXPIRED)
    assert_nothing_moved(before)
    refused(accept(alice.client, qid), USED)  # spent: the customer asks for a new quote
    assert Order.objects.count() == 1
    history = ok(alice.client.post(HISTORY), total=True)[0]
    assert [(o["orderId"], o["status"], o["errorCode"], o["errorMessage"]) for o in history] == [
        (str(order.pk), "FAILED", "10000003", EXPIRED)
    ]


def test_a_quote_expires_after_its_ttl_in_real_time(alice, settings):
    settings.QUOTE_TTL_SECONDS = 1
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    assert data["expiry"] == "1"
    time.sleep(1.05)
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, data["quoteId"]), EXPIRED)
    assert_failed_order(data["quoteId"], EXPIRED)
    assert_nothing_moved(before)


def test_a_quote_is_good_until_its_expiry(alice):
    qid = quote_id(alice.client)
    Quote.objects.filter(quote_id=qid).update(expires_at=timezone.now() + timedelta(milliseconds=500))
    assert ok(accept(alice.client, qid))["status"] == "SUCCESS"


# --- balance --------------------------------------------------------------------------------------


def test_insufficient_balance_is_refused_and_kept_as_failed(alice):
    qid = quote_id(alice.client, "PHP", "BTC", source_amount="100000.01")
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), INSUFFICIENT)
    assert_failed_order(qid, INSUFFICIENT)
    assert_nothing_moved(before)


def test_a_balance_spent_between_quote_and_accept(alice):
    first = quote_id(alice.client, "BTC", "PHP", source_amount="0.6")
    second = quote_id(alice.client, "BTC", "USDT", source_amount="0.6")
    assert ok(accept(alice.client, first))["status"] == "SUCCESS"
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, second), INSUFFICIENT)
    assert_failed_order(second, INSUFFICIENT)
    assert snapshot(alice.user.pk) == before
    assert_balance(alice.user, "BTC", "0.4")


def test_the_whole_balance_converts(alice):
    qid = quote_id(alice.client, "BTC", "PHP", source_amount="1")
    assert ok(accept(alice.client, qid))["status"] == "SUCCESS"
    assert_balance(alice.user, "BTC", "0")


# --- the house's liquidity ---------------------------------------------------------------------------


def test_liquidity_short_in_the_customers_shard_is_taken_from_the_richest(alice):
    own = shard_of(alice.user)
    drain(own, code="PHP")
    richest = next(s for s in shards() if s != own)
    refill(richest, "PHP", "1000000")
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    before = snapshot(alice.user.pk)
    assert ok(accept(alice.client, data["quoteId"]))["status"] == "SUCCESS"
    target = Decimal(data["targetAmount"])
    assert free(richest, "PHP") == before[(richest, "PHP")] - target
    assert free(richest, "BTC") == before[(richest, "BTC")] + Decimal("0.01")
    assert (free(own, "PHP"), free(own, "BTC")) == (0, before[(own, "BTC")])
    assert_balance(alice.user, "PHP", Decimal(100000) + target)
    changed = {key for key, value in snapshot(alice.user.pk).items() if value != before[key]}
    assert changed == {(alice.user.pk, "BTC"), (alice.user.pk, "PHP"), (richest, "BTC"), (richest, "PHP")}
    assert_ledger_balanced()


def test_liquidity_in_the_customers_own_shard_is_used_first(alice):
    own = shard_of(alice.user)
    other = next(s for s in shards() if s != own)
    refill(other, "PHP", "1000000")  # richer, but the customer's own shard can pay
    before = snapshot(alice.user.pk)
    assert ok(accept(alice.client, quote_id(alice.client)))["status"] == "SUCCESS"
    assert free(own, "PHP") < before[(own, "PHP")]
    assert free(other, "PHP") == before[(other, "PHP")]


def test_liquidity_short_everywhere_is_refused_and_nothing_moves(alice):
    drain(*shards(), code="PHP", leave="100")
    qid = quote_id(alice.client, "BTC", "PHP", source_amount="0.01")  # 51,896 PHP: no shard holds it
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), LIQUIDITY)
    assert_failed_order(qid, LIQUIDITY)
    assert_nothing_moved(before)


def test_liquidity_short_and_balance_short_says_insufficient_balance(alice):
    drain(*shards(), code="BTC")
    qid = quote_id(alice.client, "PHP", "BTC", source_amount="200000")
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), INSUFFICIENT)
    assert_nothing_moved(before)


def test_a_conversion_larger_than_any_one_shard_is_paid_by_several(alice):
    """The house holds 250,000,000 PHP over 16 shards (15,625,000 each); a conversion of 4 BTC
    (about 20,700,000 PHP, within the pair's maximum of 5 BTC) is paid, not refused: the house has
    the liquidity, only no single shard does."""
    fund_alice = Decimal(4)
    from tests.support.factories import fund

    fund(alice.user, "BTC", fund_alice)
    per_shard = max(free(s, "PHP") for s in shards())
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="4"))
    target = Decimal(data["targetAmount"])
    assert target > per_shard
    before = snapshot(alice.user.pk)
    assert ok(accept(alice.client, data["quoteId"]))["status"] == "SUCCESS"
    assert_balance(alice.user, "PHP", Decimal(100000) + target)
    assert_balance(alice.user, "BTC", "1")
    house_php = sum(free(s, "PHP") for s in shards())
    house_btc = sum(free(s, "BTC") for s in shards())
    assert house_php == sum(before[(s, "PHP")] for s in shards()) - target
    assert house_btc == sum(before[(s, "BTC")] for s in shards()) + 4
    assert all(free(s, "PHP") >= 0 for s in shards())
    assert Posting.objects.filter(kind=BusinessType.CONVERT).count() == 1
    assert_ledger_balanced()


# --- the last look -------------------------------------------------------------------------------------


def _move_market(base: str, quote_code: str, bps: int) -> None:
    set_market(base, quote_code, market_price(base, quote_code) * (Decimal(10000) + bps) / Decimal(10000))


@pytest.mark.parametrize(
    ("source", "target", "amount", "move_bps"),
    [
        ("BTC", "PHP", {"source_amount": "0.01"}, -60),  # BTC cheaper: the house pays too much PHP
        ("BTC", "PHP", {"target_amount": "50000"}, -60),
        ("PHP", "BTC", {"source_amount": "50000"}, +60),  # BTC dearer: the house pays too much BTC
        ("USDT", "ETH", {"source_amount": "100"}, +100),
        # within the 50 bp tolerance but beyond the 20 bp spread: the house would pay more than the
        # market's price now (a free option: quote, wait for the market, accept, convert back)
        ("BTC", "PHP", {"source_amount": "0.01"}, -40),
        ("PHP", "BTC", {"source_amount": "50000"}, +40),
    ],
)
def test_a_market_move_against_the_house_beyond_the_tolerance_is_refused(alice, source, target, amount, move_bps):
    qid = quote_id(alice.client, source, target, **amount)
    market = Pair.objects.get(source__code=source, target__code=target).market
    _move_market(market.base.code, market.quote.code, move_bps)
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), PRICE_CHANGED)
    assert_failed_order(qid, PRICE_CHANGED)
    assert_nothing_moved(before)


@pytest.mark.parametrize(
    ("source", "target", "move_bps"),
    [
        ("BTC", "PHP", -15),  # against the house, within the 50 bp tolerance and the 20 bp spread
        ("PHP", "BTC", +15),
        ("BTC", "PHP", +500),  # in the house's favour: any size
        ("PHP", "BTC", -500),
    ],
)
def test_a_market_move_within_the_tolerance_or_for_the_house_is_accepted(alice, source, target, move_bps):
    data = ok(quote(alice.client, source, target, source_amount="0.01" if source == "BTC" else "50000"))
    market = Pair.objects.get(source__code=source, target__code=target).market
    _move_market(market.base.code, market.quote.code, move_bps)
    assert ok(accept(alice.client, data["quoteId"]))["status"] == "SUCCESS"
    order = Order.objects.get()
    assert (order.source_amount, order.target_amount) == (Decimal(data["sourceAmount"]), Decimal(data["targetAmount"]))
    assert_ledger_balanced()


def test_the_tolerance_is_a_setting(alice, settings):
    settings.CONVERT_LAST_LOOK_TOLERANCE_BPS = 0
    qid = quote_id(alice.client)
    _move_market("BTC", "PHP", -1)
    refused(accept(alice.client, qid), PRICE_CHANGED)
    settings.CONVERT_LAST_LOOK_TOLERANCE_BPS = 200
    qid = quote_id(alice.client)
    _move_market("BTC", "PHP", -15)
    assert ok(accept(alice.client, qid))["status"] == "SUCCESS"
    # however large the tolerance, the house never pays more than the market's price now
    qid = quote_id(alice.client)
    _move_market("BTC", "PHP", -150)
    refused(accept(alice.client, qid), PRICE_CHANGED)


# --- the price, the business, the account, the pair at accept time -------------------------------------


def test_a_stale_price_at_accept_is_refused(alice, settings):
    qid = quote_id(alice.client)
    old = timezone.now() - timedelta(seconds=settings.CONVERT_PRICE_MAX_AGE_SECONDS + 1)
    AssetPrice.objects.filter(asset__code="BTC").update(price_updated_at=old)
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), LIQUIDITY)
    assert_failed_order(qid, LIQUIDITY)
    assert_nothing_moved(before)


def test_convert_business_off_refuses_accepts(alice):
    qid = quote_id(alice.client)
    business_status_set(business_type="CONVERT", is_on=False)
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), SUSPENDED)
    assert_failed_order(qid, SUSPENDED)
    assert_nothing_moved(before)
    business_status_set(business_type="CONVERT", is_on=True)
    assert ok(accept(alice.client, quote_id(alice.client)))["status"] == "SUCCESS"


def test_a_pair_disabled_after_the_quote(alice):
    qid = quote_id(alice.client)
    Pair.objects.filter(source__code="BTC", target__code="PHP").update(enabled=False)
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), LIQUIDITY)
    assert_failed_order(qid, LIQUIDITY)
    assert_nothing_moved(before)


def test_an_account_barred_after_the_quote(alice):
    qid = quote_id(alice.client)
    alice.user.can_withdraw = False
    alice.user.save()
    before = snapshot(alice.user.pk)
    refused(accept(alice.client, qid), ACCOUNT)
    assert_failed_order(qid, ACCOUNT)
    assert_nothing_moved(before)


def test_a_frozen_account_is_refused_by_the_service(alice):
    qid = quote_id(alice.client)
    alice.user.is_frozen = True
    alice.user.save()
    before = snapshot(alice.user.pk)
    with pytest.raises(services.errors.AccountUnavailable):
        services.quote_accept(user=alice.user, quote_id=qid)
    assert_failed_order(qid, ACCOUNT)
    assert_nothing_moved(before)


def test_a_freeze_the_checks_missed_is_caught_by_the_ledger_under_the_lock(alice, monkeypatch):
    """The account is frozen after the service's own check: the posting reads the ledger row's
    may_send under the lock and refuses; the accept is kept as FAILED, nothing moves."""
    qid = quote_id(alice.client)
    alice.user.is_frozen = True
    alice.user.save()
    stale_view = type(alice.user).objects.get(pk=alice.user.pk)
    stale_view.is_frozen = False  # the caller's cached view of the account
    before = snapshot(alice.user.pk)
    with pytest.raises(services.errors.AccountUnavailable):
        services.quote_accept(user=stale_view, quote_id=qid)
    assert_failed_order(qid, ACCOUNT)
    assert_nothing_moved(before)
