"""The outside world's and the fees accounts are sharded like the convert liquidity
(accounts/ledger/system.py, docs/ledger.md "Shards"): deposits, withdrawals and fees of customers
in different shards lock different house rows and do not queue on one lock; the book still sums to
zero; a transfer's fee refund comes from the shard that received the fee."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.db import connection, transaction

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.models import Asset, Balance, BusinessType, Entry
from accounts.ledger.system import shard_count
from accounts.models import SystemRole, User
from tests.support.factories import DepositFactory, TransferFactory, WithdrawalFactory, demo_networks, fund
from tests.support.staff import ADMINISTRATOR, staff_member
from wallet import settlement as wallet_settlement
from wallet.models import Transfer, TransferFee, Withdrawal, WithdrawalStage
from wallet.transfers import services as transfers

COIN = "USDT"
TRANSFER_FEE = Decimal("0.5")
WITHDRAWAL_FEE = Decimal(1)  # USDT on TRX in the demo world


@pytest.fixture(autouse=True)
def _world(db, settings):
    demo_networks()
    TransferFee.objects.create(asset=Asset.objects.get(code=COIN), fee=TRANSFER_FEE)
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = settings.IP_WEIGHT_LIMIT_PER_MINUTE = 10**6


def _free(account_id: int) -> Decimal:
    row = Balance.objects.filter(account_id=account_id, asset__code=COIN).values_list("free", flat=True).first()
    return row if row is not None else Decimal(0)


def _role_free(role: SystemRole) -> Decimal:
    return sum((_free(shard) for shard in ledger.role_account_ids(role)), Decimal(0))


def _shards(user: User) -> tuple[int, int]:
    return ledger.shard_account_id(SystemRole.WORLD, user.pk), ledger.shard_account_id(SystemRole.FEES, user.pk)


# --- different customers lock different house rows ------------------------------------------------


class Holder(threading.Thread):
    """Customer A's deposit and fee-bearing transfer, posted in one transaction that stays open
    (their ledger rows, A's world and fees shards among them, locked) until `release` is set."""

    def __init__(self, user: User, recipient: User) -> None:
        super().__init__()
        self.user, self.recipient = user, recipient
        self.holding, self.release = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                DepositFactory(account=self.user, amount="20", tx_id="hold-1")
                TransferFactory(sender=self.user, recipient=self.recipient, amount="5", funded=False)
                self.holding.set()
                assert self.release.wait(60), "never released"
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc
        finally:
            self.holding.set()
            connection.close()


class Mover(threading.Thread):
    """Customer B's deposit, fee-bearing transfer and withdrawal (settled at once: tasks run eagerly)."""

    def __init__(self, user: User, recipient: User, steps=("deposit", "transfer", "withdraw")) -> None:
        super().__init__()
        self.user, self.recipient, self.steps = user, recipient, steps
        self.withdrawal: Withdrawal | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if "deposit" in self.steps:
                DepositFactory(account=self.user, amount="30", tx_id="move-1")
            if "transfer" in self.steps:
                TransferFactory(sender=self.user, recipient=self.recipient, amount="4", funded=False)
            if "withdraw" in self.steps:
                self.withdrawal = WithdrawalFactory(
                    account=self.user,
                    amount="10",
                    withdraw_order_id="move-w1",
                    stage=WithdrawalStage.QUEUED,
                    funded=False,
                )
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc
        finally:
            connection.close()


def _waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0] > 0


@pytest.fixture
def parties(make_user):
    """A and B in different world and fees shards; C and D receive their transfers."""
    a, b, c, d = (make_user() for _ in range(4))
    return a, b, c, d


@pytest.mark.django_db(transaction=True)
def test_customers_in_different_shards_do_not_wait_for_each_other(parties):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite locks the whole database")
    a, b, c, d = parties
    assert len(ledger.role_account_ids(SystemRole.WORLD)) == len(ledger.role_account_ids(SystemRole.FEES)) == 16
    (world_a, fees_a), (world_b, fees_b) = _shards(a), _shards(b)
    assert world_a != world_b
    assert fees_a != fees_b
    before = {shard: _free(shard) for shard in (world_a, world_b, fees_a, fees_b)}

    holder = Holder(a, c)
    holder.start()
    try:
        assert holder.holding.wait(30)
        assert holder.error is None, holder.error
        mover = Mover(b, d)
        started = time.monotonic()
        mover.start()
        mover.join(30)
        # B finished while A's transaction still holds A's world and fees rows: it never waited.
        assert not mover.is_alive(), "B's postings waited for A's transaction"
        assert holder.is_alive()
        assert not holder.release.is_set()
        assert mover.error is None, mover.error
        elapsed = time.monotonic() - started
    finally:
        holder.release.set()
        holder.join(30)
    assert holder.error is None, holder.error
    assert elapsed < 30
    mover.withdrawal.refresh_from_db()
    assert mover.withdrawal.stage == WithdrawalStage.SUCCEEDED

    # Each customer's money went through its own shards only.
    assert _free(world_a) == before[world_a] - 20
    assert _free(fees_a) == before[fees_a] + TRANSFER_FEE
    assert _free(world_b) == before[world_b] - 30 + 10
    assert _free(fees_b) == before[fees_b] + TRANSFER_FEE + WITHDRAWAL_FEE
    assert (_free(a.pk), _free(b.pk)) == (20 - 5 - TRANSFER_FEE, 30 - 4 - TRANSFER_FEE - 10 - WITHDRAWAL_FEE)
    assert (_free(c.pk), _free(d.pk)) == (5, 4)
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_with_one_shard_they_do_wait(parties, settings):
    """The same with WORLD_SHARDS=FEES_SHARDS=1: B's deposit queues on A's lock of the one world row."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite locks the whole database")
    settings.HOUSE_ACCOUNT_SHARDS = {**settings.HOUSE_ACCOUNT_SHARDS, "world": 1, "fees": 1}
    a, b, c, d = parties
    assert (
        _shards(a)
        == _shards(b)
        == (
            ledger.system_account_id(SystemRole.WORLD),
            ledger.system_account_id(SystemRole.FEES),
        )
    )
    world = ledger.system_account_id(SystemRole.WORLD)
    before = _free(world)
    holder = Holder(a, c)
    holder.start()
    try:
        assert holder.holding.wait(30)
        assert holder.error is None, holder.error
        mover = Mover(b, d, steps=("deposit",))
        mover.start()
        deadline = time.monotonic() + 10
        while not _waiting_for_a_lock():
            assert time.monotonic() < deadline, "B's deposit never waited for a lock"
            time.sleep(0.05)
        mover.join(1)
        assert mover.is_alive(), "B's deposit did not wait for A's transaction"
    finally:
        holder.release.set()
        holder.join(30)
    mover.join(30)
    assert not mover.is_alive()
    assert holder.error is None, holder.error
    assert mover.error is None, mover.error
    assert _free(world) == before - 20 - 30
    assert ledger_check().ok


# --- the book ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_book_sums_to_zero_over_the_shards(make_user):
    """20 customers (more than the 16 shards: some share one) deposit, pay transfer fees and
    withdraw; every shard is an ordinary account, and the book, shards included, sums to zero."""
    users = [make_user() for _ in range(20)]
    sink = make_user()
    for n, user in enumerate(users):
        DepositFactory(account=user, amount="50", tx_id=f"book-{n}")
        TransferFactory(sender=user, recipient=sink, amount="3", funded=False)
        WithdrawalFactory(
            account=user, amount="10", withdraw_order_id=f"book-w{n}", stage=WithdrawalStage.QUEUED, funded=False
        )  # queued: the test's transaction never commits
    for withdrawal in Withdrawal.objects.filter(account__in=users):
        wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    assert set(Withdrawal.objects.filter(account__in=users).values_list("stage", flat=True)) == {
        WithdrawalStage.SUCCEEDED
    }
    worlds, fees = ledger.role_account_ids(SystemRole.WORLD), ledger.role_account_ids(SystemRole.FEES)
    used = {ledger.shard_account_id(SystemRole.WORLD, u.pk) for u in users}
    assert used == set(worlds)  # every shard took part
    for shard in worlds:  # each world shard mirrors its own customers' net inflow
        mine = [u for u in users if ledger.shard_account_id(SystemRole.WORLD, u.pk) == shard]
        assert _free(shard) == -40 * len(mine), shard
    for shard in fees:
        mine = [u for u in users if ledger.shard_account_id(SystemRole.FEES, u.pk) == shard]
        assert _free(shard) == (TRANSFER_FEE + WITHDRAWAL_FEE) * len(mine), shard
    assert _role_free(SystemRole.WORLD) == -40 * 20
    assert _role_free(SystemRole.FEES) == (TRANSFER_FEE + WITHDRAWAL_FEE) * 20
    everything = Balance.objects.filter(asset__code=COIN).values_list("free", "locked")
    assert sum((free + locked for free, locked in everything), Decimal(0)) == 0
    result = ledger_check()
    assert result.ok, result.report()


# --- a transfer's fee refund -----------------------------------------------------------------------


def _reversal_entries(transfer: Transfer) -> set[tuple[int, int, Decimal]]:
    transfer.refresh_from_db()
    return set(
        Entry.objects.filter(posting_id=transfer.reversal_posting_id).values_list("account_id", "side", "amount")
    )


@pytest.fixture
def operator(make_user):
    """Reverses as the admin does: two Administrators (the first asks, the second posts it; the
    rule itself: tests/wallet/test_transfer_reversal.py)."""
    asking, confirming = (staff_member(ADMINISTRATOR) for _ in range(2))

    def reverse(*, transfer, reason: str):
        transfers.transfer_reverse(transfer=transfer, reversed_by=asking, reason=reason)
        return transfers.transfer_reverse(transfer=transfer, reversed_by=confirming, reason=f"confirmed: {reason}")

    return reverse


@pytest.mark.django_db
def test_the_refund_comes_from_the_shard_that_took_the_fee_whatever_the_count_now(make_user, operator, settings):
    sender, recipient = make_user(), make_user()
    if sender.pk % shard_count(SystemRole.FEES) == 0:  # a sender whose shard is not shard 0
        sender, recipient = recipient, make_user()
    fund(sender, COIN, "100")
    credited = ledger.shard_account_id(SystemRole.FEES, sender.pk)
    transfer = TransferFactory(sender=sender, recipient=recipient, amount="10", funded=False)
    assert _free(credited) == TRANSFER_FEE
    # The count changes: the sender's shard today is another account (shard 0 with one shard).
    settings.HOUSE_ACCOUNT_SHARDS = {**settings.HOUSE_ACCOUNT_SHARDS, "fees": 1}
    assert ledger.shard_account_id(SystemRole.FEES, sender.pk) != credited
    operator(transfer=transfer, reason="wrong person")
    assert _reversal_entries(transfer) == {
        (recipient.pk, -1, Decimal(10)),
        (credited, -1, TRANSFER_FEE),
        (sender.pk, 1, Decimal(10) + TRANSFER_FEE),
    }
    assert (_free(sender.pk), _free(recipient.pk), _free(credited)) == (100, 0, 0)
    assert ledger_check().ok


@pytest.mark.django_db
def test_a_transfer_from_before_the_shards_is_refunded_from_shard_0(make_user, operator, settings):
    settings.HOUSE_ACCOUNT_SHARDS = {**settings.HOUSE_ACCOUNT_SHARDS, "fees": 1}
    sender, recipient = make_user(), make_user()
    if sender.pk % 16 == 0:  # a sender whose shard will not be shard 0
        sender = recipient
        recipient = make_user()
    fund(sender, COIN, "100")
    transfer = TransferFactory(sender=sender, recipient=recipient, amount="10", funded=False)
    settings.HOUSE_ACCOUNT_SHARDS = {**settings.HOUSE_ACCOUNT_SHARDS, "fees": 16}
    shard0 = ledger.system_account_id(SystemRole.FEES)
    assert ledger.shard_account_id(SystemRole.FEES, sender.pk) != shard0
    operator(transfer=transfer, reason="old one")
    assert (shard0, -1, TRANSFER_FEE) in _reversal_entries(transfer)
    assert _free(sender.pk) == 100
    assert ledger_check().ok


def _sweep(shard: int, amount: Decimal) -> None:
    """Fees moved out of a shard by other means than a refund (an operator's sweep: no code does it
    today), which is the only way a shard can fall short of a fee it took."""
    equity = ledger.system_account_id(SystemRole.EQUITY)
    ledger.post(legs=ledger.move(shard, equity, COIN, amount), kind=BusinessType.OTHERS, reference=f"sweep:{shard}")


@pytest.mark.django_db
def test_a_short_shard_refunds_what_it_holds_and_the_richest_other_shards_the_rest(make_user, operator):
    sender, recipient = make_user(), make_user()
    others = [make_user(), make_user()]  # two other shards, each with fees
    for user in (sender, *others):
        fund(user, COIN, "100")
    for n, user in enumerate(others):
        for _ in range(n + 1):
            TransferFactory(sender=user, recipient=recipient, amount="1", funded=False)
    credited = ledger.shard_account_id(SystemRole.FEES, sender.pk)
    richest = ledger.shard_account_id(SystemRole.FEES, others[1].pk)  # 2 fees
    assert len({credited, richest, ledger.shard_account_id(SystemRole.FEES, others[0].pk)}) == 3
    transfer = TransferFactory(sender=sender, recipient=recipient, amount="10", funded=False)
    _sweep(credited, Decimal("0.3"))  # 0.2 of the 0.5 fee left
    fees_before = _role_free(SystemRole.FEES)
    operator(transfer=transfer, reason="short shard")
    assert _reversal_entries(transfer) == {
        (recipient.pk, -1, Decimal(10)),
        (credited, -1, Decimal("0.2")),
        (richest, -1, Decimal("0.3")),
        (sender.pk, 1, Decimal("10.5")),
    }
    assert _free(sender.pk) == 100
    assert _free(credited) == 0
    assert _free(richest) == 2 * TRANSFER_FEE - Decimal("0.3")
    assert _role_free(SystemRole.FEES) == fees_before - TRANSFER_FEE
    assert ledger_check().ok


@pytest.mark.django_db
def test_a_refund_nobody_can_pay_is_refused_and_moves_nothing(make_user, operator):
    sender, recipient = make_user(), make_user()
    fund(sender, COIN, "100")
    transfer = TransferFactory(sender=sender, recipient=recipient, amount="10", funded=False)
    credited = ledger.shard_account_id(SystemRole.FEES, sender.pk)
    _sweep(credited, TRANSFER_FEE)  # no fees left anywhere
    assert _role_free(SystemRole.FEES) == 0
    with pytest.raises(InsufficientBalance):
        operator(transfer=transfer, reason="nobody pays")
    transfer.refresh_from_db()
    assert transfer.reversal_posting_id is None
    assert (_free(sender.pk), _free(recipient.pk)) == (100 - 10 - TRANSFER_FEE, 10)
    # The recipient short (the fees shard holding the fee): refused as before, nothing moved.
    other = make_user()
    fund(other, COIN, "100")
    second = TransferFactory(sender=other, recipient=recipient, amount="10", funded=False)
    transfers.transfer_create(sender=recipient, asset_code=COIN, target_address=other.email, amount=Decimal("19"))
    with pytest.raises(InsufficientBalance):
        operator(transfer=second, reason="recipient spent it")
    second.refresh_from_db()
    assert second.reversal_posting_id is None
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_a_flush_re_seeds_every_shard_the_process_remembered():
    """A test database's flush truncates the system accounts and re-sends post_migrate; the seed
    must create every shard again even though this process remembers their old ids (it once left
    WORLD's shard 0 uncreated: a later test found 15 of its 16 shards)."""
    from django.core.management import call_command

    from accounts.ledger.models import LedgerAccount

    remembered = ledger.role_account_ids(SystemRole.WORLD)  # outside any transaction: remembered
    call_command("flush", interactive=False, verbosity=0)
    shards = LedgerAccount.objects.filter(user__system_role=SystemRole.WORLD)
    assert shards.count() == len(remembered) > 1
    assert set(ledger.role_account_ids(SystemRole.WORLD)) == set(shards.values_list("user_id", flat=True))
