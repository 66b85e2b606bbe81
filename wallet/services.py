"""Wallet writes: deposit addresses, deposits, withdrawals and their settlement.

Every balance change goes through the ledger; no database transaction is held open across a
chain adapter call; settlement is a compare-and-set state machine with unique posting references,
so a task that runs twice (or a worker that died mid-task) settles exactly once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from accounts import ledger, policy
from accounts.ledger.models import Asset, BusinessType
from accounts.limits import outflow_refusal, tier_for, value_in
from accounts.models import SystemRole, User
from exchange.backoffice.services import require_reason, staff_action, summary
from exchange.runtime.amounts import decimal_places
from wallet import errors
from wallet.chain import BroadcastFailed, TxState, adapter
from wallet.models import (
    CONFIRMATIONS_FOLLOWED,
    Deposit,
    DepositAddress,
    DepositStatus,
    Network,
    WhitelistAddress,
    Withdrawal,
    WithdrawalStage,
)

logger = logging.getLogger(__name__)
ZERO = Decimal(0)
APPROVAL_CURRENCY = "PHP"  # WITHDRAWAL_APPROVAL_THRESHOLD is in this currency


def network_get(*, coin: str, network: str) -> Network:
    found = Network.objects.select_related("coin").filter(coin__code=coin, network=network).first()
    if found is None:
        if not Network.objects.filter(coin__code=coin).exists():
            raise errors.UnknownCoin()
        raise errors.UnknownNetwork()
    return found


# --- deposit addresses ---------------------------------------------------------------------------


def deposit_address_get(*, account: User, coin: str, network: str) -> DepositAddress:
    """The account's address on this network: the same one every time."""
    net = network_get(coin=coin, network=network)
    if not net.deposit_enable:
        raise errors.DepositSuspended(coin, network)
    existing = DepositAddress.objects.filter(account=account, network=net).first()
    if existing is not None:
        return existing
    address, tag = adapter().new_address(network=net, account_id=account.pk)  # outside any transaction
    try:
        with transaction.atomic():
            return DepositAddress.objects.create(account=account, network=net, address=address, tag=tag)
    except IntegrityError:  # made concurrently
        return DepositAddress.objects.get(account=account, network=net)


# --- deposits ------------------------------------------------------------------------------------


def deposit_record(
    *,
    network: Network,
    tx_id: str,
    output_index: int,
    address: str,
    tag: str,
    amount: Decimal,
    confirmations: int,
    failed: bool = False,
) -> Deposit | None:
    """Record a deposit the chain showed us (idempotent per network, tx id and output) and move it
    along. None when the address is not one of ours."""
    owner = DepositAddress.objects.filter(network=network, address=address, tag=tag).first()
    if owner is None:
        return None
    deposit = Deposit.objects.filter(network=network, tx_id=tx_id, output_index=output_index).first()
    if deposit is None:
        threshold = settings.TRAVEL_RULE_THRESHOLD
        tier = tier_for(owner.account)
        currency = tier.currency if tier else "PHP"
        value = value_in(currency, network.coin, amount)
        if network.coin.code != currency and not network.coin.reference_price > 0:
            value = None  # no price: fail closed, the deposit waits for travel-rule data
        held = bool(threshold) and (value is None or value >= threshold)
        try:
            with transaction.atomic():
                deposit = Deposit.objects.create(
                    account=owner.account,
                    network=network,
                    address=address,
                    tag=tag,
                    amount=amount,
                    tx_id=tx_id,
                    output_index=output_index,
                    confirmations=confirmations,
                    travel_rule_required=held,
                    status=DepositStatus.NEED_FILL_DATA if held else DepositStatus.PROCESSING,
                )
        except IntegrityError:
            deposit = Deposit.objects.get(network=network, tx_id=tx_id, output_index=output_index)
    return deposit_advance(deposit=deposit, confirmations=confirmations, failed=failed)


def deposit_advance(*, deposit: Deposit, confirmations: int | None = None, failed: bool = False) -> Deposit:
    """PROCESSING until minConfirm, then credited once; FAILED when the chain says so;
    NEED_FILL_DATA waits for travel-rule data."""
    if confirmations is not None and confirmations != deposit.confirmations and deposit.credited_at is None:
        Deposit.objects.filter(pk=deposit.pk).update(confirmations=confirmations)
        deposit.confirmations = confirmations
    if deposit.status in (DepositStatus.SUCCESS, DepositStatus.FAILED):
        return deposit
    if failed:
        Deposit.objects.filter(pk=deposit.pk, credited_at__isnull=True).update(status=DepositStatus.FAILED)
        deposit.refresh_from_db()
        return deposit
    if deposit.status == DepositStatus.NEED_FILL_DATA:
        return deposit
    if deposit.confirmations < deposit.network.min_confirm:
        return deposit
    with transaction.atomic():
        # Compare-and-set: only one caller moves PROCESSING to SUCCESS, and only it credits.
        won = Deposit.objects.filter(pk=deposit.pk, status=DepositStatus.PROCESSING, credited_at__isnull=True).update(
            status=DepositStatus.SUCCESS, credited_at=timezone.now()
        )
        if won:
            ledger.post(
                legs=ledger.move(
                    ledger.shard_account_id(SystemRole.WORLD, deposit.account_id),  # the customer's shard
                    deposit.account_id,
                    deposit.network.coin.code,
                    deposit.amount,
                ),
                kind=BusinessType.CHAIN_DEPOSIT,
                reference=f"deposit:{deposit.pk}",
                memo=f"{deposit.network} {deposit.tx_id}:{deposit.output_index}",
            )
    deposit.refresh_from_db()
    return deposit


def deposit_fill_travel_rule(*, deposit: Deposit, data: dict, filled_by: User) -> Deposit:
    if deposit.status != DepositStatus.NEED_FILL_DATA:
        raise ValueError("This deposit does not wait for travel-rule data.")
    if not data:
        raise ValueError("Travel-rule data is empty.")
    Deposit.objects.filter(pk=deposit.pk, status=DepositStatus.NEED_FILL_DATA).update(
        travel_rule_data={**data, "filled_by": filled_by.email, "filled_at": timezone.now().isoformat()},
        status=DepositStatus.PROCESSING,
    )
    deposit.refresh_from_db()
    logger.info("Travel-rule data filled for deposit %s by %s", deposit.pk, filled_by.email)
    return deposit_advance(deposit=deposit)


def deposits_scan() -> int:
    """Ask the chain about every enabled network's addresses; record and advance what it shows."""
    chain = adapter()
    touched = 0
    for network in Network.objects.select_related("coin").filter(deposit_enable=True):
        addresses = {(a.address, a.tag): a.account_id for a in DepositAddress.objects.filter(network=network)}
        if not addresses:
            continue
        for seen in chain.scan(network=network, addresses=addresses):
            deposit = deposit_record(
                network=network,
                tx_id=seen.tx_id,
                output_index=seen.output_index,
                address=seen.address,
                tag=seen.tag,
                amount=seen.amount,
                confirmations=seen.confirmations,
                failed=seen.failed,
            )
            touched += deposit is not None
    return touched


# --- withdrawals ---------------------------------------------------------------------------------


def whitelist_entry_remove(*, entry: WhitelistAddress, removed_by: User, reason: str | None) -> None:
    """Remove a withdrawal whitelist entry, by a staff member who may change the whitelist, with a
    reason, audited (whitelist.remove) in the same transaction. Adding and changing entries go
    through exchange.backoffice.changes (wallet/controls.py), audited the same way."""
    reason = require_reason(reason)
    if not (removed_by.is_active and removed_by.is_staff and removed_by.has_perm("wallet.change_whitelistaddress")):
        raise PermissionDenied("You may not change the withdrawal whitelist.")
    with staff_action(
        actor=removed_by, action="whitelist.remove", reason=reason, target=entry, before=summary(entry)
    ) as draft:
        WhitelistAddress.objects.filter(pk=entry.pk).delete()
        draft.after = {"removed": True}


def fits_precision(amount: Decimal, places: int) -> bool:
    """Whether `amount` has at most `places` significant decimal places (1.50 fits 1), counted exactly
    (`normalize()` would round a long amount to 28 digits and count its last places away)."""
    return decimal_places(amount) <= places


def _check_amount(network: Network, amount: Decimal) -> None:
    precision = network.coin.transfer_precision
    if amount <= 0:
        raise errors.InvalidAmount("must be positive")
    if not fits_precision(amount, precision):
        raise errors.InvalidAmount(f"at most {precision} decimal places")
    if amount < network.withdraw_min:
        raise errors.InvalidAmount(f"below the minimum {network.withdraw_min.normalize():f}")
    if amount > network.withdraw_max:
        raise errors.InvalidAmount(f"above the maximum {network.withdraw_max.normalize():f}")
    multiple = network.withdraw_integer_multiple
    if multiple and amount % multiple != 0:
        raise errors.InvalidAmount(f"must be a multiple of {multiple.normalize():f}")


def withdrawal_apply(
    *, account: User, coin: str, network: str, address: str, tag: str, amount: Decimal, withdraw_order_id: str | None
) -> Withdrawal:
    net = network_get(coin=coin, network=network)
    policy.require_may_send(account)
    if not net.withdraw_enable:
        raise errors.WithdrawalSuspended(coin, network)
    tier = tier_for(account)
    policy.require_priced(net.coin, valuation_currency=tier.currency if tier else None)  # limits
    policy.require_priced(net.coin, valuation_currency=APPROVAL_CURRENCY)  # the approval threshold
    if not WhitelistAddress.objects.filter(account=account, network=net, address=address, tag=tag or "").exists():
        raise errors.AddressNotWhitelisted()
    _check_amount(net, amount)
    fee = net.withdraw_fee
    approval = value_in(APPROVAL_CURRENCY, net.coin, amount) > settings.WITHDRAWAL_APPROVAL_THRESHOLD
    approval_value = approval_value_of(net.coin, amount + fee)
    try:
        with transaction.atomic():
            withdrawal = Withdrawal.objects.create(
                account=account,
                network=net,
                address=address,
                tag=tag or "",
                amount=amount,
                fee=fee,
                withdraw_order_id=withdraw_order_id,
                stage=WithdrawalStage.AWAITING_APPROVAL if approval else WithdrawalStage.QUEUED,
                approval_value=approval_value,
                needs_two_approvals=_above_four_eyes(approval_value),
            )  # a repeated withdrawOrderId fails here, at its unique constraint

            def guard() -> None:
                # Under the account's ledger lock (the posting's): the limit check sees every earlier
                # movement of this account, and concurrent withdrawals see each other's holds.
                refused = outflow_refusal(account, net.coin, amount + fee, withdrawal=True)
                if refused:
                    raise errors.LimitExceeded(*refused)

            ledger.post(
                senders=(account.pk,),  # re-checked under the lock: a freeze committed since stops it
                guard=guard,
                legs=ledger.hold(account.pk, net.coin.code, amount + fee),
                kind=BusinessType.CHAIN_WITHDRAWAL,
                reference=f"withdrawal:{withdrawal.pk}:hold",
                memo=f"{net} to {address}",
            )
            if not approval:
                _enqueue_after_commit(withdrawal.pk)
    except IntegrityError as exc:
        if (
            withdraw_order_id
            and Withdrawal.objects.filter(account=account, withdraw_order_id=withdraw_order_id).exists()
        ):
            raise errors.DuplicateWithdrawOrderId() from exc
        raise
    return withdrawal


# Set by wallet/tasks.py when it loads (the app's ready() imports it): hands a committed withdrawal
# to a worker without this module importing the task that imports it.
_worker: Callable[[int], object] | None = None


def set_worker(hand_over: Callable[[int], object]) -> None:
    global _worker
    _worker = hand_over


def _enqueue_after_commit(withdrawal_id: int) -> None:
    if (hand_over := _worker) is None:
        raise RuntimeError("wallet.tasks is not loaded: no worker to hand withdrawals to")
    # robust: with the broker down the withdrawal stands (committed, held); retry_stuck hands it over.
    transaction.on_commit(lambda: hand_over(withdrawal_id), robust=True)


def _transition(withdrawal_id: int, *, from_stages, to_stage: str, **fields) -> bool:
    return bool(
        Withdrawal.objects.filter(pk=withdrawal_id, stage__in=list(from_stages)).update(
            stage=to_stage, updated_at=timezone.now(), **fields
        )
    )


HELD_INFO = "held: the account may not send funds (frozen, deactivated or barred from withdrawing)"


def withdrawal_process(*, withdrawal_id: int) -> Withdrawal:
    """Broadcast and settle. Safe to run twice or after a crash at any point. A queued withdrawal of
    an account that may no longer send (frozen after applying) is not broadcast: it goes back to
    AWAITING_APPROVAL for operators to reject (funds return) or approve once the account may send."""
    # Compare-and-set on the stage and on the account's permission together (one statement): a
    # freeze committed before it holds the withdrawal; one committed after is ordered after it.
    if not Withdrawal.objects.filter(
        pk=withdrawal_id, stage=WithdrawalStage.QUEUED, account__ledger__may_send=True
    ).update(stage=WithdrawalStage.BROADCASTING, updated_at=timezone.now()):
        _transition(
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
        tx_id = adapter().broadcast(  # idempotent by reference: a second call returns the first transaction
            network=withdrawal.network,
            reference=f"withdrawal:{withdrawal.pk}",
            address=withdrawal.address,
            tag=withdrawal.tag,
            amount=withdrawal.amount,
        )
    except BroadcastFailed as exc:
        return _fail(withdrawal, info=str(exc)[:255])
    return _succeed(withdrawal, tx_id)


class _LostRace(Exception):
    """Another run made this transition first: nothing to post."""


def _settle_once(
    withdrawal: Withdrawal, *, legs, reference: str, memo: str, from_stages, to_stage: str, **fields
) -> Withdrawal:
    """Post `legs` if and only if this call moves the withdrawal from `from_stages` to `to_stage`.
    The transition runs as the posting's guard, under the account locks, so it takes its locks in
    the same order as withdrawal_apply (account first, then the withdrawal)."""

    def guard() -> None:
        if not _transition(withdrawal.pk, from_stages=from_stages, to_stage=to_stage, **fields):
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


def _fail(
    withdrawal: Withdrawal, *, info: str, decided_by: User | None = None, from_stages=(WithdrawalStage.BROADCASTING,)
) -> Withdrawal:
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


class ApprovalRefused(ValueError):
    """A four-eyes rule refused the approval (the first approver approving again)."""


def approval_value_of(coin, amount: Decimal) -> Decimal | None:
    """`amount` of `coin` in APPROVAL_CURRENCY at its reference price now; None when it has no
    price (0 or missing), which every caller treats as "above any threshold"."""
    if coin.code != APPROVAL_CURRENCY and not (coin.reference_price or ZERO) > 0:
        return None
    return value_in(APPROVAL_CURRENCY, coin, amount).quantize(Decimal(1).scaleb(-8))


def _above_four_eyes(value: Decimal | None) -> bool:
    above = settings.WITHDRAWAL_FOUR_EYES_ABOVE
    if above is None:
        return False
    return value is None or value > above  # no price: fail closed


def needs_two_approvals(withdrawal: Withdrawal) -> bool:
    """Whether approving `withdrawal` takes two staff members. Decided when it was applied
    (`needs_two_approvals`, from its `approval_value`: amount plus fee in APPROVAL_CURRENCY) and
    only ever raised since: it also takes two when its value at today's reference price is above
    WITHDRAWAL_FOUR_EYES_ABOVE, or when the asset has no price now. A price lowered (even to 0)
    after it was applied never lets one person send it. And it takes two when the customer's
    withdrawals of the last WITHDRAWAL_FOUR_EYES_WINDOW_HOURS together are above the threshold
    (`recent_withdrawals_value`): a large sum split into pieces that each one person could approve."""
    if settings.WITHDRAWAL_FOUR_EYES_ABOVE is None:
        return False  # four eyes switched off for this deployment
    if withdrawal.needs_two_approvals or withdrawal.approval_value is None:
        return True
    coin = Asset.objects.get(pk=withdrawal.network.coin_id)  # today's price, not a cached row's
    if _above_four_eyes(approval_value_of(coin, withdrawal.amount + withdrawal.fee)):
        return True
    return _above_four_eyes(recent_withdrawals_value(withdrawal))


def _family_ids(account_id: int) -> list[int]:
    """The customer an account belongs to: its master (or itself) and every sub-account of it."""
    master_id = User.objects.filter(pk=account_id).values_list("master_id", flat=True).get() or account_id
    return [master_id, *User.objects.filter(master_id=master_id).values_list("pk", flat=True)]


def recent_withdrawals_value(withdrawal: Withdrawal) -> Decimal | None:
    """What the customer of `withdrawal` (its account, the account's master and their sub-accounts)
    asked to withdraw in the last WITHDRAWAL_FOUR_EYES_WINDOW_HOURS, `withdrawal` included: the sum
    of each withdrawal's `approval_value` (amount plus fee in APPROVAL_CURRENCY when applied, as the
    thresholds measure), over every one not failed or rejected, whatever its stage (those waiting
    for approval too: two approvals of two pieces at once each count the other). None when one of
    them has no recorded value (no price when applied): every caller treats that as above."""
    since = timezone.now() - timedelta(hours=settings.WITHDRAWAL_FOUR_EYES_WINDOW_HOURS)
    values = list(
        Withdrawal.objects.filter(account_id__in=_family_ids(withdrawal.account_id), applied_at__gte=since)
        .exclude(stage=WithdrawalStage.FAILED)
        .exclude(pk=withdrawal.pk)
        .values_list("approval_value", flat=True)
    )
    values.append(withdrawal.approval_value)
    if any(value is None for value in values):
        return None
    return sum(values, ZERO)


def withdrawal_approve(*, withdrawal: Withdrawal, approved_by: User) -> Withdrawal:
    """Send a withdrawal that waits for an operator. Refused (ValueError) while its account may not
    send funds: reject it instead, or unfreeze the account first.

    Four eyes: a withdrawal worth more than WITHDRAWAL_FOUR_EYES_ABOVE, alone or with the customer's
    other withdrawals of the last 24 hours (needs_two_approvals), needs two approvals by two
    staff members. The first is recorded (first_approved_by) and the withdrawal keeps waiting; the
    second, by anyone else, sends it; the first approver approving again is refused
    (ApprovalRefused). The row is locked for the decision, so two concurrent approvals queue and
    the later one sees the earlier."""
    if not policy.may_send(User.objects.get(pk=withdrawal.account_id)):
        raise ValueError(f"Withdrawal {withdrawal.pk}: {HELD_INFO.removeprefix('held: ')}; reject it instead.")
    with transaction.atomic():
        locked = Withdrawal.objects.select_for_update().select_related("network__coin").get(pk=withdrawal.pk)
        if locked.stage == WithdrawalStage.AWAITING_APPROVAL and needs_two_approvals(locked):
            if locked.first_approved_by_id is None:
                Withdrawal.objects.filter(pk=locked.pk).update(
                    first_approved_by=approved_by,
                    first_approved_at=timezone.now(),
                    updated_at=timezone.now(),
                    needs_two_approvals=True,  # kept, whatever the prices or the day's sum do next
                )
                withdrawal.refresh_from_db()
                return withdrawal  # waits for the second approver
            if locked.first_approved_by_id == approved_by.pk:
                raise ApprovalRefused(
                    f"Withdrawal {withdrawal.pk} needs a second approver: you gave the first approval."
                )
        if _transition(
            withdrawal.pk,
            from_stages=[WithdrawalStage.AWAITING_APPROVAL],
            to_stage=WithdrawalStage.QUEUED,
            decided_by=approved_by,
        ):
            _enqueue_after_commit(withdrawal.pk)
    withdrawal.refresh_from_db()
    return withdrawal


def withdrawal_reject(
    *, withdrawal: Withdrawal, rejected_by: User, reason: str = "rejected by operations"
) -> Withdrawal:
    return _fail(
        withdrawal,
        info=reason,
        decided_by=rejected_by,
        from_stages=(WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED),
    )


def withdrawal_retry(*, withdrawal: Withdrawal) -> None:
    """Hand a queued or stuck broadcasting withdrawal to a worker again (safe: see withdrawal_process)."""
    if withdrawal.stage in (WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING):
        _enqueue_after_commit(withdrawal.pk)


def withdrawals_retry_stuck() -> int:
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.WITHDRAWAL_RETRY_AFTER_SECONDS)
    candidates = Withdrawal.objects.filter(
        stage__in=[WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING], updated_at__lt=cutoff
    ).values_list("pk", flat=True)
    handed = 0
    for pk in list(candidates):
        # Claim it (compare-and-set on updated_at) so the next run does not send it again.
        if Withdrawal.objects.filter(pk=pk, updated_at__lt=cutoff).update(updated_at=now):
            _enqueue_after_commit(pk)
            handed += 1
    return handed


def withdrawals_refresh_confirmations() -> None:
    chain = adapter()
    for withdrawal in (
        Withdrawal.objects.select_related("network")
        .filter(stage=WithdrawalStage.SUCCEEDED, confirmations__lt=CONFIRMATIONS_FOLLOWED)
        .exclude(tx_id="")[:500]
    ):
        state, count = chain.confirmations(network=withdrawal.network, tx_id=withdrawal.tx_id)
        if state is not TxState.FAILED and count != withdrawal.confirmations:
            Withdrawal.objects.filter(pk=withdrawal.pk).update(confirmations=count)
