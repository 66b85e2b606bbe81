"""What an accepted quote writes: one CONVERT posting (the customer's source to a liquidity shard,
the shard's target to the customer, the fee to the fees account), the order row with it, the
customer's change-feed rows (kind CONVERT for both assets: the relay's balanceUpdate BS CONVERT),
the transaction history (bizSubject CONVERT on both tokens), and no use of the account's limits."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.ledger.models import BalanceChange, BusinessType, Entry, LimitCounter, Posting
from convert.models import Order, OrderStatus, Pair
from tests.convert.helpers import accept, fees_account, fees_total, free, ok, quote, set_market, shard_of
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.factories import customer

TX_HISTORY = "/openapi/v1/asset/transaction/history"


@pytest.fixture
def alice(convert_world):
    return customer(funding={"BTC": "1", "PHP": "100000"})


def _entries(posting_id: int) -> set[tuple[int, str, str, int, Decimal]]:
    return {
        (e.account_id, e.asset.code, e.bucket, e.side, e.amount)
        for e in Entry.objects.filter(posting_id=posting_id).select_related("asset")
    }


def _accept(client, source, target, amount) -> tuple[dict, Order]:
    data = ok(quote(client, source, target, source_amount=amount))
    accepted = ok(accept(client, data["quoteId"]))
    order = Order.objects.get(pk=accepted["orderId"])
    return data, order


def test_one_convert_posting_moves_both_balances(alice):
    shard = shard_of(alice.user)
    shard_btc, shard_php = free(shard, "BTC"), free(shard, "PHP")
    data, order = _accept(alice.client, "BTC", "PHP", "0.01")
    target = Decimal(data["targetAmount"])
    assert order.status == OrderStatus.SUCCESS
    assert (order.error_code, order.error_message) == ("", "")
    assert (order.source_amount, order.target_amount, order.fee) == (Decimal("0.01"), target, 0)
    assert order.user_id == alice.user.pk
    assert order.quote.quote_id == data["quoteId"]
    posting = Posting.objects.get(kind=BusinessType.CONVERT)
    assert order.posting_id == posting.pk
    assert posting.reference == f"convert:{data['quoteId']}"
    assert _entries(posting.pk) == {
        (alice.user.pk, "BTC", "F", -1, Decimal("0.01")),
        (shard, "BTC", "F", 1, Decimal("0.01")),
        (shard, "PHP", "F", -1, target),
        (alice.user.pk, "PHP", "F", 1, target),
    }
    assert_balance(alice.user, "BTC", "0.99")
    assert_balance(alice.user, "PHP", Decimal(100000) + target)
    assert (free(shard, "BTC"), free(shard, "PHP")) == (shard_btc + Decimal("0.01"), shard_php - target)
    assert order.created_at == posting.created_at
    assert_ledger_balanced()


def test_the_fee_leg_goes_to_the_fees_account(alice):
    set_market("BTC", "PHP", "5200000", spread_bps=0)
    Pair.objects.filter(source__code="BTC", target__code="PHP").update(fee_bps=25)
    fees = fees_account(alice.user)  # alice's shard of the fees account
    fees_before = free(fees, "PHP")
    others_before = fees_total("PHP") - fees_before
    shard = shard_of(alice.user)
    data, order = _accept(alice.client, "BTC", "PHP", "0.00012346")  # gross 641.99, fee 1.61
    assert (data["targetAmount"], order.fee) == ("640.38", Decimal("1.61"))
    assert _entries(order.posting_id) == {
        (alice.user.pk, "BTC", "F", -1, Decimal("0.00012346")),
        (shard, "BTC", "F", 1, Decimal("0.00012346")),
        (shard, "PHP", "F", -1, Decimal("641.99")),
        (alice.user.pk, "PHP", "F", 1, Decimal("640.38")),
        (fees, "PHP", "F", 1, Decimal("1.61")),
    }
    assert free(fees, "PHP") == fees_before + Decimal("1.61")
    assert fees_total("PHP") - free(fees, "PHP") == others_before  # no other shard moved
    assert_balance(alice.user, "PHP", "100640.38")
    history = ok(alice.client.post("/openapi/convert/v1/query-order-history"), total=True)[0]
    assert history[0]["fee"] == "1.61"
    assert_ledger_balanced()


def test_the_customers_change_feed_says_convert_for_both_assets(alice):
    """The streams relay turns these rows into balanceUpdate (BS CONVERT) and
    outboundAccountPosition events: one posting, so one event batch with both assets."""
    data, order = _accept(alice.client, "BTC", "PHP", "0.01")
    rows = list(
        BalanceChange.objects.filter(account_id=alice.user.pk, posting_id=order.posting_id).select_related("asset")
    )
    assert {(r.asset.code, r.kind, r.delta_free, r.free_after) for r in rows} == {
        ("BTC", BusinessType.CONVERT, Decimal("-0.01"), Decimal("0.99")),
        ("PHP", BusinessType.CONVERT, Decimal(data["targetAmount"]), Decimal(100000) + Decimal(data["targetAmount"])),
    }
    assert len({r.seq for r in rows}) == 2
    assert all(r.delta_locked == 0 for r in rows)


def test_transaction_history_shows_convert_on_both_tokens(alice):
    data, order = _accept(alice.client, "BTC", "PHP", "0.01")
    for token, changed in (("BTC", "-0.01000000"), ("PHP", data["targetAmount"])):
        response = alice.client.get(TX_HISTORY, {"tokenId": token})
        assert response.status_code == 200, response.content
        converts = [t for t in response.json()["transactions"] if t["bizSubject"] == "CONVERT"]
        assert converts == [
            {
                "txId": str(order.posting_id),
                "bizSubject": "CONVERT",
                "status": "SUCCESS",
                "changed": changed,
                "tokenId": token,
                "time": converts[0]["time"],
            }
        ]


def test_conversions_do_not_use_the_account_limits(alice):
    counters_before = sorted(
        LimitCounter.objects.filter(account=alice.user).values_list(
            "asset__code", "span", "deposits", "withdrawals", "p2p_in", "p2p_out"
        )
    )
    account_before = alice.client.get("/openapi/v1/account").json()
    _accept(alice.client, "BTC", "PHP", "0.5")
    _accept(alice.client, "PHP", "BTC", "50000")
    counters_after = sorted(
        LimitCounter.objects.filter(account=alice.user).values_list(
            "asset__code", "span", "deposits", "withdrawals", "p2p_in", "p2p_out"
        )
    )
    assert counters_after == counters_before
    account_after = alice.client.get("/openapi/v1/account").json()
    for block in ("daily", "monthly", "annually", "p2pDaily", "p2pMonthly", "p2pAnnually"):
        assert account_after[block] == account_before[block], block
    assert account_before["daily"]["cashOutRemaining"] == account_before["daily"]["cashOutLimit"]
    assert_ledger_balanced()  # the check recomputes the counters from the journal too
