from decimal import Decimal

import pytest
from django.db import IntegrityError

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.errors import InsufficientBalance
from accounts.models import Balance, BalanceChange, Entry, Posting, SystemRole


@pytest.fixture
def btc(db):
    from accounts.models import Asset

    return Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8)


def _balance(user, code="BTC"):
    row = Balance.objects.filter(account=user, asset__code=code).first()
    return (row.free, row.locked) if row else (Decimal(0), Decimal(0))


def test_deposit_move_hold_release_settle(make_user, btc):
    alice, bob = make_user(), make_user()
    world = ledger.shard_account_id(SystemRole.WORLD, alice.id)  # alice's shards, as the wallet posts
    fees = ledger.shard_account_id(SystemRole.FEES, alice.id)
    ledger.post(legs=ledger.move(world, alice.id, "BTC", Decimal("2.5")), kind="CHAIN_DEPOSIT", reference="dep:1")
    ledger.post(legs=ledger.move(alice.id, bob.id, "BTC", Decimal("0.5")), kind="P2P_TRANSFER", reference="p2p:1")
    ledger.post(legs=ledger.hold(alice.id, "BTC", Decimal("1")), kind="CHAIN_WITHDRAWAL", reference="wd:1:hold")
    assert _balance(alice) == (Decimal("1"), Decimal("1"))
    ledger.post(legs=ledger.release(alice.id, "BTC", Decimal("0.25")), kind="CHAIN_WITHDRAWAL", reference="wd:1:rel")
    result = ledger.post(
        legs=[
            *ledger.settle(alice.id, world, "BTC", Decimal("0.7")),
            *ledger.settle(alice.id, fees, "BTC", Decimal("0.05")),
        ],
        kind="CHAIN_WITHDRAWAL",
        reference="wd:1:settle",
    )
    assert _balance(alice) == (Decimal("1.25"), Decimal("0"))
    assert _balance(bob) == (Decimal("0.5"), Decimal("0"))
    assert _balance(world) == (Decimal("-1.8"), Decimal("0"))  # the outside world mirrors what came in
    assert {b.account_id for b in result.balances} == {alice.id, world, fees}
    assert ledger_check().ok


def test_debit_beyond_balance_is_refused_and_changes_nothing(make_user, btc):
    alice, bob = make_user(), make_user()
    with pytest.raises(InsufficientBalance):
        ledger.post(
            legs=ledger.move(alice.id, bob.id, "BTC", Decimal("0.00000001")), kind="P2P_TRANSFER", reference="p2p:x"
        )
    assert Posting.objects.count() == 0
    assert Entry.objects.count() == 0
    assert BalanceChange.objects.count() == 0


def test_unbalanced_or_float_legs_are_refused(make_user, btc):
    alice = make_user()
    with pytest.raises(ValueError, match="sum to zero"):
        ledger.post(legs=[ledger.Leg(alice.id, "BTC", Decimal(1))], kind="OTHERS", reference="bad")
    with pytest.raises(TypeError):
        ledger.post(legs=[ledger.Leg(alice.id, "BTC", 1.0)], kind="OTHERS", reference="bad")
    with pytest.raises(ValueError, match="decimal places"):
        ledger.post(legs=ledger.move(alice.id, alice.id + 1, "BTC", Decimal("1e-19")), kind="OTHERS", reference="x")


def test_reference_is_unique(make_user, btc):
    alice = make_user()
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, alice.id, "BTC", Decimal(1)), kind="CHAIN_DEPOSIT", reference="dep:same")
    with pytest.raises(IntegrityError):
        ledger.post(legs=ledger.move(world, alice.id, "BTC", Decimal(1)), kind="CHAIN_DEPOSIT", reference="dep:same")


def test_change_feed_rows_carry_per_account_sequence(make_user, btc):
    alice = make_user()
    world = ledger.system_account_id(SystemRole.WORLD)
    for i in range(3):
        ledger.post(legs=ledger.move(world, alice.id, "BTC", Decimal(1)), kind="CHAIN_DEPOSIT", reference=f"d{i}")
    rows = list(BalanceChange.objects.filter(account=alice).order_by("seq").values_list("seq", "free_after", "kind"))
    assert rows == [
        (1, Decimal(1), "CHAIN_DEPOSIT"),
        (2, Decimal(2), "CHAIN_DEPOSIT"),
        (3, Decimal(3), "CHAIN_DEPOSIT"),
    ]


# --- a business row written with the posting (LinkedRow) -------------------------------------------


def _adjustment_row(account, btc, amount, reason="linked row test"):
    from accounts.ledger.models import ManualAdjustment

    values = {"account_id": account, "asset_id": btc.id, "amount": amount, "reason": reason, "created_by_id": account}
    return ledger.LinkedRow(ManualAdjustment, values)


def test_a_linked_row_is_written_with_the_posting_with_its_id_and_time(make_user, btc):
    from accounts.ledger.models import ManualAdjustment

    alice = make_user()
    world = ledger.system_account_id(SystemRole.WORLD)
    result = ledger.post(
        legs=ledger.move(world, alice.id, "BTC", Decimal("1.5")),
        kind="OTHERS",
        reference="linked:1",
        row=_adjustment_row(alice.id, btc, Decimal("1.5")),
    )
    row = ManualAdjustment.objects.get()
    assert result.row_id == row.id
    assert row.posting_id == result.posting_id
    assert row.created_at == result.created_at == Posting.objects.get(pk=result.posting_id).created_at
    expected = (alice.id, btc.id, Decimal("1.5"), "linked row test")
    assert (row.account_id, row.asset_id, row.amount, row.reason) == expected


def test_a_refused_posting_writes_no_linked_row(make_user, btc):
    from accounts.ledger.models import ManualAdjustment

    alice, bob = make_user(), make_user()
    with pytest.raises(InsufficientBalance):
        ledger.post(
            legs=ledger.move(alice.id, bob.id, "BTC", Decimal("1")),
            kind="OTHERS",
            reference="linked:poor",
            row=_adjustment_row(alice.id, btc, Decimal("1")),
        )
    # Even an amount too large for the column is no error when the posting is refused first.
    with pytest.raises(InsufficientBalance):
        ledger.post(
            legs=ledger.move(alice.id, bob.id, "BTC", Decimal("1" * 30)),
            kind="OTHERS",
            reference="linked:huge",
            row=_adjustment_row(alice.id, btc, Decimal("1" * 30)),
        )
    assert not ManualAdjustment.objects.exists()
    assert not Posting.objects.filter(reference__startswith="linked:").exists()


def test_a_linked_row_the_database_refuses_undoes_the_posting(make_user, btc):
    from django.db import DataError, connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite does not enforce VARCHAR lengths")
    alice = make_user()
    world = ledger.system_account_id(SystemRole.WORLD)
    with pytest.raises(DataError):  # too long for VARCHAR(255): refused, never cut short
        ledger.post(
            legs=ledger.move(world, alice.id, "BTC", Decimal("1")),
            kind="OTHERS",
            reference="linked:long",
            row=_adjustment_row(alice.id, btc, Decimal("1"), reason="x" * 256),
        )
    assert not Posting.objects.filter(reference="linked:long").exists()
    assert _balance(alice) == (Decimal(0), Decimal(0))
