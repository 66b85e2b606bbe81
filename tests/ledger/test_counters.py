"""Limit counters: written by the posting, equal to the journal's recomputation, checked by the
ledger check, per UTC calendar period; and the limits read them."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.db import connection

from accounts import ledger
from accounts.ledger.check import journal_free_changes, ledger_check
from accounts.ledger.counters import from_journal, period_keys
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.posting import api as posting
from accounts.limits import usage
from accounts.models import Asset, LimitCounter, SystemRole


@pytest.fixture
def coins(db):
    return {
        "BTC": Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8, reference_price=Decimal(1000)),
        "PHP": Asset.objects.create(code="PHP", name="Peso", transfer_precision=2, reference_price=Decimal(1)),
    }


def counters_of(account_id: int) -> dict[tuple[str, str, date], list[Decimal]]:
    return {
        (c.asset.code, c.span, c.period_start): [c.deposits, c.withdrawals, c.p2p_in, c.p2p_out]
        for c in LimitCounter.objects.filter(account_id=account_id).select_related("asset")
    }


def history(alice: int, bob: int) -> None:
    world = ledger.shard_account_id(SystemRole.WORLD, alice)  # alice's shards, as the wallet posts
    fees = ledger.shard_account_id(SystemRole.FEES, alice)
    ledger.post(legs=ledger.move(world, alice, "BTC", Decimal("2.5")), kind="CHAIN_DEPOSIT", reference="dep:1")
    ledger.post(legs=ledger.move(world, alice, "PHP", Decimal("500")), kind="FIAT_DEPOSIT", reference="dep:2")
    ledger.post(legs=ledger.move(alice, bob, "BTC", Decimal("0.5")), kind="P2P_TRANSFER", reference="p2p:1")
    ledger.post(legs=ledger.move(bob, alice, "BTC", Decimal("0.125")), kind="P2P_TRANSFER", reference="p2p:2")
    ledger.post(legs=ledger.hold(alice, "BTC", Decimal(1)), kind="CHAIN_WITHDRAWAL", reference="wd:1:hold")
    ledger.post(legs=ledger.release(alice, "BTC", Decimal("0.25")), kind="CHAIN_WITHDRAWAL", reference="wd:1:rel")
    ledger.post(
        legs=[*ledger.settle(alice, world, "BTC", Decimal("0.7")), *ledger.settle(alice, fees, "BTC", Decimal("0.05"))],
        kind="CHAIN_WITHDRAWAL",
        reference="wd:1:settle",
    )
    ledger.post(legs=ledger.move(world, alice, "PHP", Decimal("7")), kind="DISTRIBUTION", reference="gift:1")


def test_postings_keep_counters_per_period_as_the_journal_gives_them(make_user, coins):
    alice, bob = make_user().id, make_user().id
    history(alice, bob)
    today = period_keys(datetime.now(UTC))
    for span, start in today:
        # deposits net, withdrawals net (hold -1, release +0.25; the settlement leaves locked), p2p in, out
        assert counters_of(alice)[("BTC", span, start)] == [
            Decimal("2.5"),
            Decimal("-0.75"),
            Decimal("0.125"),
            Decimal("0.5"),
        ]
        assert counters_of(alice)[("PHP", span, start)] == [Decimal(500), 0, 0, 0]  # DISTRIBUTION counts nothing
        assert counters_of(bob)[("BTC", span, start)] == [0, 0, Decimal("0.5"), Decimal("0.125")]
    assert len(counters_of(alice)) == 6  # 2 assets x day, month, year
    with connection.cursor() as cursor:
        recomputed = from_journal(journal_free_changes(cursor))
    stored = {
        (c.account_id, c.asset_id, c.span, c.period_start): [c.deposits, c.withdrawals, c.p2p_in, c.p2p_out]
        for c in LimitCounter.objects.all()
    }
    assert stored == recomputed
    assert ledger_check().ok


def test_service_accounts_keep_no_counters(make_user, coins):
    history(make_user().id, make_user().id)
    system = [shard for role in (SystemRole.WORLD, SystemRole.FEES) for shard in ledger.role_account_ids(role)]
    assert not LimitCounter.objects.filter(account_id__in=system).exists()


def test_refused_posting_counts_nothing(make_user, coins):
    alice, bob = make_user().id, make_user().id
    with pytest.raises(InsufficientBalance):
        ledger.post(legs=ledger.move(alice, bob, "BTC", Decimal(1)), kind="P2P_TRANSFER", reference="p2p:none")
    assert not LimitCounter.objects.exists()


def test_ledger_check_reports_a_counter_that_differs_from_the_journal(make_user, coins):
    alice, bob = make_user().id, make_user().id
    history(alice, bob)
    LimitCounter.objects.filter(account_id=bob, span="M").update(p2p_in=Decimal("0.4"))
    result = ledger_check()
    assert not result.ok
    assert any(f"account {bob}" in p and "limit counter M" in p for p in result.problems), result.problems
    LimitCounter.objects.filter(account_id=bob, span="D").delete()
    assert any("limit counter D" in p for p in ledger_check().problems)


def test_periods_are_utc_calendar_days_months_and_years(make_user, coins, monkeypatch):
    alice, bob = make_user().id, make_user().id
    world = ledger.shard_account_id(SystemRole.WORLD, alice)
    monkeypatch.setattr(posting.timezone, "now", lambda: datetime(2026, 2, 10, 8, tzinfo=UTC))
    ledger.post(legs=ledger.move(world, alice, "PHP", Decimal(100)), kind="FIAT_DEPOSIT", reference="dep:0")
    moments = {
        "last year": datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC),
        "january": datetime(2026, 1, 15, 12, tzinfo=UTC),
        "march 1st": datetime(2026, 3, 1, 0, 0, tzinfo=UTC),
        "march 1st later": datetime(2026, 3, 1, 23, 59, 59, 999999, tzinfo=UTC),
    }
    for n, moment in enumerate(moments.values()):
        monkeypatch.setattr(posting.timezone, "now", lambda moment=moment: moment)
        ledger.post(legs=ledger.move(alice, bob, "PHP", Decimal(n + 1)), kind="P2P_TRANSFER", reference=f"p2p:{n}")
    monkeypatch.undo()
    rows = counters_of(alice)
    assert rows[("PHP", "D", date(2026, 3, 1))][3] == Decimal(3 + 4)
    assert rows[("PHP", "M", date(2026, 3, 1))][3] == Decimal(3 + 4)
    assert rows[("PHP", "M", date(2026, 1, 1))][3] == Decimal(2)
    assert rows[("PHP", "Y", date(2026, 1, 1))][3] == Decimal(2 + 3 + 4)
    assert rows[("PHP", "Y", date(2025, 1, 1))][3] == Decimal(1)
    assert rows[("PHP", "D", date(2025, 12, 31))][3] == Decimal(1)

    user = type("U", (), {"pk": alice})()
    spent = usage(user, currency="PHP", now=datetime(2026, 3, 1, 18, tzinfo=UTC))
    assert spent["day"][1].cash_out == Decimal(7)
    assert spent["month"][1].cash_out == Decimal(7)
    assert spent["year"][1].cash_out == Decimal(9)
    assert spent["year"][0].cash_in == Decimal(100)  # deposited in February
    assert spent["month"][0].cash_in == Decimal(0)
    later = usage(user, currency="PHP", now=datetime(2026, 3, 2, 0, tzinfo=UTC))
    assert later["day"][1].cash_out == Decimal(0)
    assert later["month"][1].cash_out == Decimal(7)


def test_usage_values_every_asset_at_its_reference_price(make_user, coins):
    alice, bob = make_user().id, make_user().id
    history(alice, bob)
    user = type("U", (), {"pk": alice})()
    everything, p2p = usage(user, currency="PHP")["day"]
    # in: 2.5 BTC deposited + 0.125 BTC received at 1000, plus 500 PHP
    assert everything.cash_in == Decimal("2625") + Decimal(500)
    # out: 0.75 BTC withdrawn (held, less the release) + 0.5 BTC sent
    assert everything.cash_out == Decimal("1250")
    assert everything.withdraw == Decimal("750")
    assert (p2p.cash_in, p2p.cash_out, p2p.withdraw) == (Decimal(125), Decimal(500), Decimal(500))
    Asset.objects.filter(code="BTC").update(reference_price=Decimal(2000))
    assert usage(user, currency="PHP")["day"][0].cash_out == Decimal("2500")
    assert usage(user, currency="BTC")["day"][0].withdraw == Decimal("0.75")


def test_usage_of_an_asset_whose_price_is_gone_fails_closed(make_user, coins):
    """Issue 25, finding 2: a reference price set to 0 (or missing) must not make an account's past
    movements of that asset count as nothing against its limits: they count as more than any limit,
    so nothing more goes out until the asset is priced again. An asset with no movements is not
    affected."""
    alice, bob = make_user().id, make_user().id
    history(alice, bob)
    user = type("U", (), {"pk": alice})()
    Asset.objects.filter(code="BTC").update(reference_price=Decimal(0))
    everything, p2p = usage(user, currency="PHP")["day"]
    assert everything.cash_out > Decimal("1e20")
    assert everything.withdraw > Decimal("1e20")
    assert p2p.cash_out > Decimal("1e20")
    Asset.objects.filter(code="BTC").update(reference_price=Decimal(1000))
    assert usage(user, currency="PHP")["day"][0].cash_out == Decimal("1250")
    carol = type("U", (), {"pk": make_user().id})()
    Asset.objects.filter(code="BTC").update(reference_price=Decimal(0))
    assert usage(carol, currency="PHP")["day"][0].cash_out == Decimal(0)
