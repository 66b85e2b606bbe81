"""The withdrawal's state machine after it is applied: the hand-over to a worker, the broadcast, the
settle or release posting, and the sweeps that pick up what a crashed worker left.

    AWAITING_APPROVAL --approve--> QUEUED --worker--> BROADCASTING --chain--> SUCCEEDED
            |                        |                     |
            +------reject------------+---------------------+--failed--> FAILED (funds released)

Every transition is a compare-and-set on the stage, and each posting has a unique reference, so a
task that runs twice (or a worker that died mid-task) settles exactly once. Who may move a
withdrawal out of AWAITING_APPROVAL, and when it waits there at all, is wallet/approvals.py.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import BusinessType
from accounts.models import SystemRole, User
from exchange.runtime.handoff import WorkerHandOff
from wallet.chain import BroadcastFailed, TxState, adapter
from wallet.models import CONFIRMATIONS_FOLLOWED, Withdrawal, WithdrawalStage

HELD_INFO = "held: the account may not send funds (frozen, deactivated or barred from withdrawing)"

# wallet/tasks.py registers the withdrawal task when it loads (the app's ready() imports it): a
# committed withdrawal reaches a worker without this module importing the task module, which imports
# this one (exchange/runtime/handoff.py).
_hand_off = WorkerHandOff(tasks_module="wallet.tasks", what="withdrawals")
set_worker = _hand_off.set_worker
hand_to_worker = _hand_off.after_commit  # with the broker down, withdrawals_retry_stuck hands it over later


def transition(withdrawal_id: int, *, from_stages, to_stage: str, **fields) -> bool:
    """Move the withdrawal to `to_stage` if it is in one of `from_stages` now; whether it moved."""
    return bool(
        Withdrawal.objects.filter(pk=withdrawal_id, stage__in=list(from_stages)).update(
            stage=to_stage, updated_at=timezone.now(), **fields
        )
    )


def withdrawal_process(*, withdrawal_id: int) -> Withdrawal:
    """Broadcast and settle. Safe to run twice or after a crash at any point.

    A queued withdrawal of an account that may no longer send (frozen after applying) is not
    broadcast: it goes back to AWAITING_APPROVAL, where operators reject it (the funds return) or
    approve it once the account may send again."""
    # One statement compares and sets the stage and the account's permission together: a freeze
    # committed before it holds the withdrawal, and one committed after it is ordered after it.
    if not Withdrawal.objects.filter(
        pk=withdrawal_id, stage=WithdrawalStage.QUEUED, account__ledger__may_send=True
    ).update(stage=WithdrawalStage.BROADCASTING, updated_at=timezone.now()):
        transition(
            withdrawal_id,
            from_stages=[WithdrawalStage.QUEUED],
            to_stage=WithdrawalStage.AWAITING_APPROVAL,
            info=HELD_INFO,
        )
    Withdrawal.objects.filter(pk=withdrawal_id, stage=WithdrawalStage.BROADCASTING).update(attempts=F("attempts") + 1)
    withdrawal = Withdrawal.objects.select_related("network__coin").get(pk=withdrawal_id)
    if withdrawal.stage != WithdrawalStage.BROADCASTING:
        return withdrawal  # settled already, or waiting for an operator
    try:
        # The adapter's broadcast is idempotent by reference: a second call returns the first
        # call's transaction instead of sending the coins again.
        tx_id = adapter().broadcast(
            network=withdrawal.network,
            reference=f"withdrawal:{withdrawal.pk}",
            address=withdrawal.address,
            tag=withdrawal.tag,
            amount=withdrawal.amount,
        )
    except BroadcastFailed as exc:
        return fail_and_release(withdrawal, info=str(exc)[:255])
    return _succeed(withdrawal, tx_id)


class _LostRace(Exception):
    """Another run made this transition first: there is nothing to post."""


def _settle_once(
    withdrawal: Withdrawal, *, legs, reference: str, memo: str, from_stages, to_stage: str, **fields
) -> Withdrawal:
    """Post `legs` if and only if this call moves the withdrawal from `from_stages` to `to_stage`.

    The transition runs as the posting's guard, under the account locks, so it takes its locks in
    the same order as withdrawal_apply does (the account first, then the withdrawal)."""

    def guard() -> None:
        if not transition(withdrawal.pk, from_stages=from_stages, to_stage=to_stage, **fields):
            raise _LostRace()

    with contextlib.suppress(_LostRace):
        ledger.post(legs=legs, kind=BusinessType.CHAIN_WITHDRAWAL, reference=reference, memo=memo[:255], guard=guard)
    withdrawal.refresh_from_db()
    return withdrawal


def _succeed(withdrawal: Withdrawal, tx_id: str) -> Withdrawal:
    coin = withdrawal.network.coin.code
    # The customer's shards of the world and fees accounts (accounts/ledger/system.py): withdrawals
    # of different customers lock different house rows.
    world = ledger.shard_account_id(SystemRole.WORLD, withdrawal.account_id)
    legs = ledger.settle(withdrawal.account_id, world, coin, withdrawal.amount)
    if withdrawal.fee > 0:
        fees = ledger.shard_account_id(SystemRole.FEES, withdrawal.account_id)
        legs += ledger.settle(withdrawal.account_id, fees, coin, withdrawal.fee)
    return _settle_once(
        withdrawal,
        legs=legs,
        reference=f"withdrawal:{withdrawal.pk}:settle",
        memo=f"{withdrawal.network} {tx_id}",
        from_stages=[WithdrawalStage.BROADCASTING],
        to_stage=WithdrawalStage.SUCCEEDED,
        tx_id=tx_id,
    )


def fail_and_release(
    withdrawal: Withdrawal, *, info: str, decided_by: User | None = None, from_stages=(WithdrawalStage.BROADCASTING,)
) -> Withdrawal:
    """Mark the withdrawal FAILED and release its held amount and fee to the account, once."""
    return _settle_once(
        withdrawal,
        legs=ledger.release(withdrawal.account_id, withdrawal.network.coin.code, withdrawal.amount + withdrawal.fee),
        reference=f"withdrawal:{withdrawal.pk}:release",
        memo=info,
        from_stages=from_stages,
        to_stage=WithdrawalStage.FAILED,
        info=info,
        decided_by=decided_by,
    )


def withdrawal_retry(*, withdrawal: Withdrawal) -> None:
    """Hand a queued or stuck broadcasting withdrawal to a worker again (safe: see withdrawal_process)."""
    if withdrawal.stage in (WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING):
        hand_to_worker(withdrawal.pk)


def withdrawals_retry_stuck() -> int:
    """Hand every withdrawal queued or broadcasting for longer than WITHDRAWAL_RETRY_AFTER_SECONDS to
    a worker again; how many were handed over."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.WITHDRAWAL_RETRY_AFTER_SECONDS)
    candidates = Withdrawal.objects.filter(
        stage__in=[WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING], updated_at__lt=cutoff
    ).values_list("pk", flat=True)
    handed = 0
    for pk in list(candidates):
        # Claim it (a compare-and-set on updated_at), so that the next sweep does not hand it over again.
        if Withdrawal.objects.filter(pk=pk, updated_at__lt=cutoff).update(updated_at=now):
            hand_to_worker(pk)
            handed += 1
    return handed


def withdrawals_refresh_confirmations() -> None:
    """Follow the confirmations of sent withdrawals until each has CONFIRMATIONS_FOLLOWED."""
    chain = adapter()
    for withdrawal in (
        Withdrawal.objects.select_related("network")
        .filter(stage=WithdrawalStage.SUCCEEDED, confirmations__lt=CONFIRMATIONS_FOLLOWED)
        .exclude(tx_id="")[:500]
    ):
        state, count = chain.confirmations(network=withdrawal.network, tx_id=withdrawal.tx_id)
        if state is not TxState.FAILED and count != withdrawal.confirmations:
            Withdrawal.objects.filter(pk=withdrawal.pk).update(confirmations=count)
