"""A withdrawal's life: held, broadcast by a worker, settled exactly once (SUCCESS with the fee to
the fees account, or FAILED with the funds released); operator approval above a threshold;
settlement that runs twice or after a crash; concurrent withdrawals that never overdraw."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.errors import InsufficientBalance
from accounts.models import Balance, BalanceChange, Posting, SystemRole, User
from exchange.api.errors import ExchangeError
from tests.support.client import SignedClient
from tests.support.factories import demo_networks, fund
from wallet import approvals as wallet_approvals
from wallet import settlement as wallet_settlement
from wallet import withdrawals as wallet_withdrawals
from wallet.chain import adapter
from wallet.chain.simulator import advance_blocks
from wallet.models import (
    Network,
    SimBroadcastFailure,
    SimTransaction,
    WhitelistAddress,
    Withdrawal,
    WithdrawalStage,
    WithdrawalStatus,
)

APPLY = "/openapi/wallet/v1/withdraw/apply"
HISTORY = "/openapi/wallet/v1/withdraw/history"
TRX_ADDRESS = "TCaro1WhiteListAddress111111111111"


@pytest.fixture(autouse=True)
def _networks(db):
    """The demo world's assets and networks (USDT on TRX: fee 1, minimum 10), without its accounts."""
    demo_networks()


@pytest.fixture(autouse=True)
def _roomy_rate_limits(settings):
    """withdraw/apply weighs 100 against a UID limit of 180: lift the limits for these tests."""
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**6
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 10**6


def _free_locked(user_id: int, code: str = "USDT") -> tuple[Decimal, Decimal]:
    row = Balance.objects.filter(account_id=user_id, asset__code=code).first()
    return (row.free, row.locked) if row else (Decimal(0), Decimal(0))


def _role_free(role: SystemRole, code: str = "USDT") -> Decimal:
    """What the house holds in `role`: the sum over its shards."""
    rows = Balance.objects.filter(account_id__in=ledger.role_account_ids(role), asset__code=code)
    return sum(rows.values_list("free", flat=True), Decimal(0))


def _whitelist(user: User, address: str = TRX_ADDRESS) -> None:
    WhitelistAddress.objects.create(
        account=user, network=Network.objects.get(coin__code="USDT", network="TRX"), address=address, name="mine"
    )


@pytest.fixture
def carol(make_user):
    user = make_user()
    fund(user, "USDT", "100")
    _whitelist(user)
    return user


@pytest.fixture
def carol_client(carol, make_key):
    api_key, secret = make_key(carol)
    return SignedClient(api_key.key, secret)


@pytest.fixture
def operator(db):
    return User.objects.create_superuser(email="ops@wallet-life.example", password="pw-for-tests")


def _apply(client, amount: str = "10", **extra) -> Withdrawal:
    response = client.post(APPLY, {"coin": "USDT", "network": "TRX", "address": TRX_ADDRESS, "amount": amount, **extra})
    assert response.status_code == 200, response.content
    return Withdrawal.objects.get(pk=int(response.json()["id"]))


def _apply_queued(client, django_capture_on_commit_callbacks, amount: str = "10") -> Withdrawal:
    """Applied, with the worker's task not run (the withdrawal stays QUEUED)."""
    with django_capture_on_commit_callbacks(execute=False):
        withdrawal = _apply(client, amount)
    assert withdrawal.stage == WithdrawalStage.QUEUED
    return withdrawal


def _postings(withdrawal: Withdrawal, step: str) -> int:
    return Posting.objects.filter(reference=f"withdrawal:{withdrawal.pk}:{step}").count()


def _broadcasts(withdrawal: Withdrawal) -> int:
    return SimTransaction.objects.filter(client_reference=f"withdrawal:{withdrawal.pk}", incoming=False).count()


# --- success -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_success(carol, carol_client, django_capture_on_commit_callbacks):
    fees = ledger.shard_account_id(SystemRole.FEES, carol.pk)  # carol's shards
    world = ledger.shard_account_id(SystemRole.WORLD, carol.pk)
    fees_before, world_before = _free_locked(fees)[0], _free_locked(world)[0]
    totals_before = _role_free(SystemRole.FEES), _role_free(SystemRole.WORLD)
    free0, _ = _free_locked(carol.pk)

    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10", withdrawOrderId="life-1")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert withdrawal.status == WithdrawalStatus.SUCCESS
    assert len(withdrawal.tx_id) == 64
    assert withdrawal.info == ""
    assert _free_locked(carol.pk) == (free0 - Decimal(11), Decimal(0))
    assert _free_locked(fees)[0] == fees_before + Decimal(1)
    assert _free_locked(world)[0] == world_before + Decimal(10)
    assert (_role_free(SystemRole.FEES), _role_free(SystemRole.WORLD)) == (  # no other shard moved
        totals_before[0] + Decimal(1),
        totals_before[1] + Decimal(10),
    )

    sent = SimTransaction.objects.get(client_reference=f"withdrawal:{withdrawal.pk}")
    assert (sent.tx_id, sent.address, sent.amount, sent.incoming) == (withdrawal.tx_id, TRX_ADDRESS, Decimal(10), False)
    assert (_postings(withdrawal, "hold"), _postings(withdrawal, "settle"), _postings(withdrawal, "release")) == (
        1,
        1,
        0,
    )

    [record] = carol_client.get(HISTORY, {"withdrawOrderId": "life-1"}).json()
    assert record["status"] == 1
    assert record["txId"] == withdrawal.tx_id
    assert record["amount"] == "10.000000"
    assert record["transactionFee"] == "1.000000"
    assert ledger_check().ok


@pytest.mark.django_db
def test_events_for_hold_and_settle(carol, carol_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10")
    hold = BalanceChange.objects.get(account=carol, posting__reference=f"withdrawal:{withdrawal.pk}:hold")
    settle = BalanceChange.objects.get(account=carol, posting__reference=f"withdrawal:{withdrawal.pk}:settle")
    assert hold.kind == settle.kind == "CHAIN_WITHDRAWAL"
    assert (hold.delta_free, hold.delta_locked) == (Decimal(-11), Decimal(11))
    assert (settle.delta_free, settle.delta_locked) == (Decimal(0), Decimal(-11))
    assert (settle.free_after, settle.locked_after) == (Decimal(89), Decimal(0))
    assert settle.seq > hold.seq
    fee_change = BalanceChange.objects.get(
        account_id=ledger.shard_account_id(SystemRole.FEES, carol.pk),
        posting__reference=f"withdrawal:{withdrawal.pk}:settle",
    )
    assert (fee_change.kind, fee_change.delta_free) == ("CHAIN_WITHDRAWAL", Decimal(1))
    assert ledger_check().ok


@pytest.mark.django_db
def test_confirmations_follow_the_chain(carol, carol_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10")
    advance_blocks(4, network="TRX")
    wallet_settlement.withdrawals_refresh_confirmations()
    withdrawal.refresh_from_db()
    assert withdrawal.confirmations == 5
    [record] = carol_client.get(HISTORY).json()
    assert record["confirmNo"] == 5
    assert ledger_check().ok


# --- failure -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_broadcast_failure_releases_the_funds(carol, carol_client, django_capture_on_commit_callbacks):
    SimBroadcastFailure.objects.create(address=TRX_ADDRESS)
    fees_before = _role_free(SystemRole.FEES)  # every shard
    start = _free_locked(carol.pk)
    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10", withdrawOrderId="fails")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.FAILED
    assert withdrawal.status == WithdrawalStatus.FAILED
    assert withdrawal.info
    assert withdrawal.tx_id == ""
    assert _free_locked(carol.pk) == start == (Decimal(100), Decimal(0))
    assert _role_free(SystemRole.FEES) == fees_before
    assert (_postings(withdrawal, "hold"), _postings(withdrawal, "settle"), _postings(withdrawal, "release")) == (
        1,
        0,
        1,
    )
    release = BalanceChange.objects.get(account=carol, posting__reference=f"withdrawal:{withdrawal.pk}:release")
    assert (release.kind, release.delta_free, release.delta_locked) == ("CHAIN_WITHDRAWAL", Decimal(11), Decimal(-11))

    [record] = carol_client.get(HISTORY, {"withdrawOrderId": "fails"}).json()
    assert record["status"] == 2
    assert record["info"] == withdrawal.info
    assert record["txId"] == ""

    # A failed withdrawal is final: running the worker again neither sends nor releases twice.
    SimBroadcastFailure.objects.all().delete()
    wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.FAILED
    assert _broadcasts(withdrawal) == 0
    assert _postings(withdrawal, "release") == 1
    assert _free_locked(carol.pk) == (Decimal(100), Decimal(0))
    assert ledger_check().ok


# --- approval ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_approval_above_threshold(carol, carol_client, operator, settings, django_capture_on_commit_callbacks):
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("100")  # PHP; 10 USDT is 580 PHP
    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert withdrawal.status == WithdrawalStatus.PROCESSING
    assert _free_locked(carol.pk) == (Decimal(89), Decimal(11))
    assert carol_client.get(HISTORY).json()[0]["status"] == 0

    # Workers leave it alone until an operator decides.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
        wallet_settlement.withdrawal_retry(withdrawal=withdrawal)
        wallet_settlement.withdrawals_retry_stuck()
    assert callbacks == []
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert _broadcasts(withdrawal) == 0

    with django_capture_on_commit_callbacks(execute=True):
        wallet_approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=operator, reason="checked")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert withdrawal.decided_by == operator
    assert _free_locked(carol.pk) == (Decimal(89), Decimal(0))
    assert carol_client.get(HISTORY).json()[0]["status"] == 1

    # Approving again changes nothing.
    with django_capture_on_commit_callbacks(execute=True):
        wallet_approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=operator, reason="checked")
    assert _postings(withdrawal, "settle") == 1
    assert _broadcasts(withdrawal) == 1
    assert ledger_check().ok


@pytest.mark.django_db
def test_at_the_threshold_no_approval(carol, carol_client, settings, django_capture_on_commit_callbacks):
    # Exactly 10 USDT plus its 1 USDT fee (11 USDT at 58 PHP): only above waits.
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("638")
    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    with django_capture_on_commit_callbacks(execute=True):
        second = _apply(carol_client, "10.000001")
    second.refresh_from_db()
    assert second.stage == WithdrawalStage.AWAITING_APPROVAL
    assert ledger_check().ok


@pytest.mark.django_db
def test_the_approval_threshold_measures_amount_plus_fee_as_the_four_eyes_one_does(
    carol, carol_client, settings, django_capture_on_commit_callbacks
):
    """10 USDT is 580 PHP, its 1 USDT fee 58 more: with the threshold between the two, the
    withdrawal waits, valued as the four-eyes threshold values it (approval_value)."""
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("600")
    with django_capture_on_commit_callbacks(execute=True):
        withdrawal = _apply(carol_client, "10")
    withdrawal.refresh_from_db()
    assert withdrawal.approval_value == Decimal("638")
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert _broadcasts(withdrawal) == 0
    assert _free_locked(carol.pk) == (Decimal(89), Decimal(11))
    assert ledger_check().ok


@pytest.mark.django_db
def test_reject_releases_the_funds(carol, carol_client, operator, settings, django_capture_on_commit_callbacks):
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("100")
    withdrawal = _apply(carol_client, "10")
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    wallet_approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=operator, reason="suspicious")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.FAILED
    assert withdrawal.info == "suspicious"
    assert withdrawal.decided_by == operator
    assert _free_locked(carol.pk) == (Decimal(100), Decimal(0))
    assert carol_client.get(HISTORY).json()[0]["status"] == 2

    # Neither an approval nor a worker after the rejection sends anything.
    with django_capture_on_commit_callbacks(execute=True):
        wallet_approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=operator, reason="checked")
        wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
        wallet_approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=operator, reason="rejected by operations")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.FAILED
    assert withdrawal.info == "suspicious"
    assert _broadcasts(withdrawal) == 0
    assert _postings(withdrawal, "release") == 1
    assert _free_locked(carol.pk) == (Decimal(100), Decimal(0))
    assert ledger_check().ok


@pytest.mark.django_db
def test_reject_a_queued_withdrawal_before_the_worker(
    carol, carol_client, operator, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        withdrawal = _apply(carol_client, "10")
    wallet_approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=operator, reason="rejected by operations")
    for callback in callbacks:  # the worker's task arrives late
        callback()
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.FAILED
    assert _broadcasts(withdrawal) == 0
    assert _free_locked(carol.pk) == (Decimal(100), Decimal(0))
    assert ledger_check().ok


# --- exactly once ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_process_twice_settles_once(carol, carol_client, django_capture_on_commit_callbacks):
    fees = ledger.shard_account_id(SystemRole.FEES, carol.pk)
    fees_before, total_before = _free_locked(fees)[0], _role_free(SystemRole.FEES)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        withdrawal = _apply(carol_client, "10")
    first = wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    second = wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    for callback in callbacks:  # and the queued task too
        callback()
    assert first.stage == second.stage == WithdrawalStage.SUCCEEDED
    assert first.tx_id == second.tx_id
    withdrawal.refresh_from_db()
    assert withdrawal.attempts == 1
    assert _postings(withdrawal, "settle") == 1
    assert _broadcasts(withdrawal) == 1
    assert _free_locked(carol.pk) == (Decimal(89), Decimal(0))
    assert _free_locked(fees)[0] == fees_before + Decimal(1)
    assert _role_free(SystemRole.FEES) == total_before + Decimal(1)
    assert BalanceChange.objects.filter(account=carol, kind="CHAIN_WITHDRAWAL").count() == 2  # hold, settle
    assert ledger_check().ok


@pytest.mark.django_db
def test_worker_died_after_broadcasting(carol, carol_client, django_capture_on_commit_callbacks):
    """The first worker moved it to BROADCASTING and sent it, then died: the next one settles with
    the same transaction and sends nothing again."""
    withdrawal = _apply_queued(carol_client, django_capture_on_commit_callbacks)
    Withdrawal.objects.filter(pk=withdrawal.pk).update(stage=WithdrawalStage.BROADCASTING)
    tx_id = adapter().broadcast(
        network=withdrawal.network,
        reference=f"withdrawal:{withdrawal.pk}",
        address=withdrawal.address,
        tag=withdrawal.tag,
        amount=withdrawal.amount,
    )
    settled = wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    assert settled.stage == WithdrawalStage.SUCCEEDED
    assert settled.tx_id == tx_id
    assert _broadcasts(withdrawal) == 1
    assert _postings(withdrawal, "settle") == 1
    assert _free_locked(carol.pk) == (Decimal(89), Decimal(0))
    assert ledger_check().ok


@pytest.mark.django_db
def test_worker_died_before_broadcasting(carol, carol_client, django_capture_on_commit_callbacks):
    withdrawal = _apply_queued(carol_client, django_capture_on_commit_callbacks)
    Withdrawal.objects.filter(pk=withdrawal.pk).update(stage=WithdrawalStage.BROADCASTING)
    wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert _broadcasts(withdrawal) == 1
    assert _postings(withdrawal, "settle") == 1
    assert ledger_check().ok


@pytest.mark.django_db
def test_stuck_withdrawals_are_retried(carol, carol_client, settings, django_capture_on_commit_callbacks):
    withdrawal = _apply_queued(carol_client, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        assert wallet_settlement.withdrawals_retry_stuck() == 0  # not old enough yet
    old = timezone.now() - timedelta(seconds=settings.WITHDRAWAL_RETRY_AFTER_SECONDS + 5)
    Withdrawal.objects.filter(pk=withdrawal.pk).update(updated_at=old)
    with django_capture_on_commit_callbacks(execute=True):
        assert wallet_settlement.withdrawals_retry_stuck() == 1
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert _postings(withdrawal, "settle") == 1
    assert ledger_check().ok


# --- concurrency -------------------------------------------------------------------------------


def _in_threads(count: int, work) -> list:
    """Run work(i) in `count` threads started together; each closes its connection at the end."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - collected and asserted by the test
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return results


def _racer(make_user, funds: str) -> User:
    user = make_user()
    fund(user, "USDT", funds)
    _whitelist(user)
    return user


@pytest.mark.django_db(transaction=True)
def test_concurrent_withdrawals_never_overdraw(make_user):
    """55 USDT pays for exactly five 10 USDT withdrawals on TRX (fee 1); twelve race for it.
    (The system accounts exist beforehand, as in any running service: their first creation under
    concurrency is test_first_fee_account_rolled_back_is_not_remembered's subject.)"""
    user = _racer(make_user, "55")
    ledger.role_account_ids(SystemRole.WORLD)  # every shard
    ledger.role_account_ids(SystemRole.FEES)

    def withdraw(i: int):
        account = User.objects.get(pk=user.pk)
        return wallet_withdrawals.withdrawal_apply(
            account=account,
            coin="USDT",
            network="TRX",
            address=TRX_ADDRESS,
            tag="",
            amount=Decimal("10"),
            withdraw_order_id=f"race-{i}",
        )

    results = _in_threads(12, withdraw)
    won = [r for r in results if isinstance(r, Withdrawal)]
    refused = [r for r in results if isinstance(r, InsufficientBalance)]  # answered -1131
    assert len(won) == 5, results
    assert len(refused) == 7, results
    assert Withdrawal.objects.filter(account=user).count() == 5
    assert set(Withdrawal.objects.filter(account=user).values_list("stage", flat=True)) == {WithdrawalStage.SUCCEEDED}
    assert _free_locked(user.pk) == (Decimal(0), Decimal(0))
    assert not BalanceChange.objects.filter(account=user, free_after__lt=0).exists()
    assert not BalanceChange.objects.filter(account=user, locked_after__lt=0).exists()
    assert Balance.objects.filter(free__lt=0, allow_negative=False).count() == 0
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_concurrent_same_withdraw_order_id(make_user):
    user = _racer(make_user, "1000")
    ledger.role_account_ids(SystemRole.WORLD)  # every shard
    ledger.role_account_ids(SystemRole.FEES)

    def withdraw(_i: int):
        return wallet_withdrawals.withdrawal_apply(
            account=User.objects.get(pk=user.pk),
            coin="USDT",
            network="TRX",
            address=TRX_ADDRESS,
            tag="",
            amount=Decimal("10"),
            withdraw_order_id="the-same",
        )

    results = _in_threads(8, withdraw)
    won = [r for r in results if isinstance(r, Withdrawal)]
    refused = [r for r in results if isinstance(r, ExchangeError)]
    assert len(won) == 1, [str(r) for r in results]
    assert len(refused) == 7, [str(r) for r in results]
    assert {r.code for r in refused} == {-1010}
    assert _free_locked(user.pk) == (Decimal(989), Decimal(0))
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_repeated_withdraw_order_id_while_the_first_settles(make_user, settings, monkeypatch):
    """A client repeats a withdrawal (same withdrawOrderId) while a worker settles the first one.
    The repeat must be refused with -1010 and the settlement must go through. The order of events
    is forced: the worker has moved the first withdrawal to SUCCEEDED (row updated, not committed)
    and is about to post the settlement when the repeat arrives."""
    import time

    user = _racer(make_user, "1000")
    ledger.role_account_ids(SystemRole.WORLD)  # every shard
    ledger.role_account_ids(SystemRole.FEES)
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1")  # no task on commit: the test runs the worker

    def apply():
        return wallet_withdrawals.withdrawal_apply(
            account=User.objects.get(pk=user.pk),
            coin="USDT",
            network="TRX",
            address=TRX_ADDRESS,
            tag="",
            amount=Decimal("10"),
            withdraw_order_id="again",
        )

    first = apply()
    Withdrawal.objects.filter(pk=first.pk).update(stage=WithdrawalStage.QUEUED)
    settling = threading.Event()
    real_settle = ledger.settle

    def slow_settle(*args, **kwargs):
        if not settling.is_set():
            settling.set()
            time.sleep(1.0)  # the repeat comes in now
        return real_settle(*args, **kwargs)

    monkeypatch.setattr(ledger, "settle", slow_settle)

    def work(i: int):
        if i == 0:
            return wallet_settlement.withdrawal_process(withdrawal_id=first.pk).stage
        assert settling.wait(timeout=30)
        return apply()

    worker, repeat = _in_threads(2, work)
    assert worker == WithdrawalStage.SUCCEEDED, str(worker)
    assert isinstance(repeat, ExchangeError), str(repeat)
    assert repeat.code == -1010, str(repeat)
    assert Withdrawal.objects.filter(account=user).count() == 1
    assert _free_locked(user.pk) == (Decimal(989), Decimal(0))
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_settle_once(make_user, settings):
    """Eight workers process the same withdrawal at once: one broadcast, one settlement."""
    user = _racer(make_user, "100")
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1")  # held for approval: no task runs on commit
    withdrawal = wallet_withdrawals.withdrawal_apply(
        account=user,
        coin="USDT",
        network="TRX",
        address=TRX_ADDRESS,
        tag="",
        amount=Decimal("10"),
        withdraw_order_id=None,
    )
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    Withdrawal.objects.filter(pk=withdrawal.pk).update(stage=WithdrawalStage.QUEUED)

    results = _in_threads(8, lambda _i: wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk).stage)
    assert all(r in (WithdrawalStage.SUCCEEDED, WithdrawalStage.BROADCASTING) for r in results), results
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert _broadcasts(withdrawal) == 1
    assert _postings(withdrawal, "settle") == 1
    assert _free_locked(user.pk) == (Decimal(89), Decimal(0))
    assert ledger_check().ok


# --- failures around settlement ----------------------------------------------------------------


@pytest.mark.django_db
def test_first_fee_account_rolled_back_is_not_remembered(carol, carol_client, monkeypatch):
    """The first settlement ever creates the fees account inside its transaction; when that
    transaction rolls back (a deadlock, a crash), the next settlement must not post to the id of
    the account that was rolled back (it no longer exists: the commit would fail on the foreign key,
    in every later settlement of this process)."""
    # The fees account is seeded after migrate; take it away to create it on first use again.
    from accounts.ledger.system import forget_cached_ids
    from accounts.models import LedgerAccount

    fees = User.objects.get(pk=ledger.shard_account_id(SystemRole.FEES, carol.pk))  # carol's shard
    LedgerAccount.objects.filter(user=fees).delete()
    fees.delete()
    forget_cached_ids()
    withdrawal = _apply(carol_client, "10")  # the test's transaction never commits: no task runs
    real_post = ledger.post

    def deadlock_once(**kwargs):
        monkeypatch.setattr(ledger, "post", real_post)
        raise RuntimeError("deadlock detected (simulated)")

    monkeypatch.setattr(ledger, "post", deadlock_once)
    with pytest.raises(RuntimeError):
        wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.BROADCASTING  # rolled back; a retry will settle it

    settled = wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    assert settled.stage == WithdrawalStage.SUCCEEDED
    fee_change = BalanceChange.objects.get(posting__reference=f"withdrawal:{withdrawal.pk}:settle", delta_free=1)
    shard = carol.pk % len(ledger.role_account_ids(SystemRole.FEES))
    assert User.objects.filter(pk=fee_change.account_id, system_role=SystemRole.FEES, system_shard=shard).exists(), (
        f"the fee was posted to account #{fee_change.account_id}, which does not exist"
    )
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_broker_down_does_not_refuse_an_accepted_withdrawal(make_user, make_key, monkeypatch, settings):
    """The withdrawal is committed (funds held) before its task is sent. When sending fails (broker
    unreachable), the client must still get the id (200), not an error that invites a second
    withdrawal; the stuck-withdrawal sweep sends it later."""
    from kombu.exceptions import OperationalError as BrokerDown

    from wallet.tasks import withdrawal_process_task

    user = _racer(make_user, "100")
    api_key, secret = make_key(user)
    client = SignedClient(api_key.key, secret)

    def broker_down(*args, **kwargs):
        raise BrokerDown("Error 111 connecting to redis: Connection refused.")

    monkeypatch.setattr(withdrawal_process_task, "delay", broker_down)
    response = client.post(
        APPLY, {"coin": "USDT", "network": "TRX", "address": TRX_ADDRESS, "amount": "10", "withdrawOrderId": "bd-1"}
    )
    withdrawal = Withdrawal.objects.get(account=user)
    assert withdrawal.stage == WithdrawalStage.QUEUED
    assert _free_locked(user.pk) == (Decimal(89), Decimal(11))
    assert response.status_code == 200, response.content
    assert response.json() == {"id": str(withdrawal.pk)}

    monkeypatch.undo()
    old = timezone.now() - timedelta(seconds=settings.WITHDRAWAL_RETRY_AFTER_SECONDS + 5)
    Withdrawal.objects.filter(pk=withdrawal.pk).update(updated_at=old)
    wallet_settlement.withdrawals_retry_stuck()
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert ledger_check().ok
