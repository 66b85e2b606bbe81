"""Withdrawals as the customer asks for them: the whitelist, the amount's checks, and
`withdrawal_apply`, which holds the amount plus the fee in the ledger and either queues the
withdrawal for the chain or leaves it waiting for a staff member's approval (the rule and who
approves: wallet/approvals.py). What happens after (broadcast, settle, release, retries) is
wallet/settlement.py.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import IntegrityError, transaction

from accounts import ledger, policy
from accounts.ledger.models import BusinessType
from accounts.limits import outflow_refusal, tier_for
from accounts.models import User
from exchange.backoffice.services import require_permission, require_reason, staff_action, summary
from exchange.runtime.amounts import decimal_places
from wallet import errors
from wallet.approvals import APPROVAL_CURRENCY, above_four_eyes, approval_value_of, needs_approval
from wallet.models import Network, WhitelistAddress, Withdrawal, WithdrawalStage
from wallet.selectors import network_get
from wallet.settlement import hand_to_worker


def whitelist_entry_remove(*, entry: WhitelistAddress, removed_by: User, reason: str | None) -> None:
    """Remove a withdrawal whitelist entry, by a staff member who may change the whitelist, with a
    reason, audited (whitelist.remove) in the same transaction. Adding and changing entries go
    through exchange.backoffice.changes (wallet/controls.py), audited the same way."""
    reason = require_reason(reason)
    require_permission(removed_by, "wallet.change_whitelistaddress", "You may not change the withdrawal whitelist.")
    with staff_action(
        actor=removed_by, action="whitelist.remove", reason=reason, target=entry, before=summary(entry)
    ) as draft:
        WhitelistAddress.objects.filter(pk=entry.pk).delete()
        draft.after = {"removed": True}


def fits_precision(amount: Decimal, places: int) -> bool:
    """Whether `amount` has at most `places` significant decimal places (1.50 fits 1), counted
    exactly: `normalize()` would round a long amount to 28 digits and count its last places away."""
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
    """The customer's withdrawal of `amount` (the fee comes on top) to a whitelisted address.

    The amount plus the fee is held in one posting, under the account's ledger lock, after the
    tier's limits are checked there. Worth more than WITHDRAWAL_APPROVAL_THRESHOLD (amount plus fee
    in APPROVAL_CURRENCY, wallet/approvals.py) it waits for a staff member; otherwise it is handed
    to a worker when the transaction commits. A repeated withdrawOrderId is refused."""
    net = network_get(coin=coin, network=network)
    policy.require_may_send(account)
    if not net.withdraw_enable:
        raise errors.WithdrawalSuspended(coin, network)
    tier = tier_for(account)
    policy.require_priced(net.coin, valuation_currency=tier.currency if tier else None)  # for the limits
    policy.require_priced(net.coin, valuation_currency=APPROVAL_CURRENCY)  # for the approval thresholds
    if not WhitelistAddress.objects.filter(account=account, network=net, address=address, tag=tag or "").exists():
        raise errors.AddressNotWhitelisted()
    _check_amount(net, amount)
    fee = net.withdraw_fee
    # One value for both thresholds: the approval and the four eyes measure the same amount plus fee.
    approval_value = approval_value_of(net.coin, amount + fee)
    approval = needs_approval(approval_value)
    try:
        with transaction.atomic():
            # A repeated withdrawOrderId fails here, at its unique constraint.
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
                needs_two_approvals=above_four_eyes(approval_value),
            )

            def guard() -> None:
                # This runs under the account's ledger lock (the posting's): the limit check sees
                # every earlier movement of this account, and concurrent withdrawals see each
                # other's holds.
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
                hand_to_worker(withdrawal.pk)
    except IntegrityError as exc:
        if (
            withdraw_order_id
            and Withdrawal.objects.filter(account=account, withdraw_order_id=withdraw_order_id).exists()
        ):
            raise errors.DuplicateWithdrawOrderId() from exc
        raise
    return withdrawal
