"""Who may approve a withdrawal, and when a withdrawal waits for approval at all: the one place.

When it waits. Every withdrawal is valued once, when it is applied: its amount plus its fee in
APPROVAL_CURRENCY at the asset's reference price (`approval_value`, kept on the row). The same value
is measured against both thresholds (docs/operations.md, "Large withdrawals"):

- above WITHDRAWAL_APPROVAL_THRESHOLD it waits in AWAITING_APPROVAL for a staff member
  (`needs_approval`); at or below it, it is queued for the chain at once;
- above WITHDRAWAL_FOUR_EYES_ABOVE (when set) the approval takes two staff members, the second not
  the first (`needs_two_approvals`). So does a withdrawal whose customer's withdrawals of the last
  WITHDRAWAL_FOUR_EYES_WINDOW_HOURS add up to more (`recent_withdrawals_value`), or whose asset has
  no price now.

`check_thresholds`, a Django system check of the wallet app, refuses to start a process whose
WITHDRAWAL_FOUR_EYES_ABOVE is below WITHDRAWAL_APPROVAL_THRESHOLD: a withdrawal worth between the
two would need two approvers but would never wait for even one.

Who approves. A staff member with APPROVE_PERMISSION ("change withdrawal": the Treasury and
Administrator roles of exchange/backoffice/roles.py) approves or rejects, with a reason.
`withdrawal_approve` and `withdrawal_reject` check that permission and write the audit row
(exchange.backoffice.services.staff_action) themselves, whoever calls them: the admin's actions
(wallet/admin.py) only call them and show the outcome. The database keeps the last word on four
eyes: the `withdrawal_two_approvers` constraint (wallet/models.py) refuses a row whose first and
second approver are the same person.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core import checks
from django.db import transaction
from django.utils import timezone

from accounts import policy
from accounts.ledger.models import Asset
from accounts.limits import value_in
from accounts.models import User
from exchange.backoffice.services import require_permission, require_reason, staff_action, summary
from wallet.models import Withdrawal, WithdrawalStage
from wallet.settlement import HELD_INFO, fail_and_release, hand_to_worker, transition, withdrawal_retry

ZERO = Decimal(0)
APPROVAL_CURRENCY = "PHP"  # both thresholds are in this currency
APPROVE_PERMISSION = "wallet.change_withdrawal"
# The withdrawal's fields the audit trail pictures before and after a decision.
AUDITED_FIELDS = (
    "account",
    "network",
    "amount",
    "fee",
    "approval_value",
    "needs_two_approvals",
    "stage",
    "first_approved_by",
    "decided_by",
    "tx_id",
    "info",
)


class ApprovalRefused(ValueError):
    """A four-eyes rule refused the approval (the first approver approving again)."""


# --- the value and the thresholds ------------------------------------------------------------------


def approval_value_of(coin: Asset, amount: Decimal) -> Decimal | None:
    """`amount` of `coin` in APPROVAL_CURRENCY at its reference price now; None when it has no price
    (0 or missing), which every caller treats as "above any threshold"."""
    if coin.code != APPROVAL_CURRENCY and not (coin.reference_price or ZERO) > 0:
        return None
    return value_in(APPROVAL_CURRENCY, coin, amount).quantize(Decimal(1).scaleb(-8))


def needs_approval(value: Decimal | None) -> bool:
    """Whether a withdrawal worth `value` (its approval_value: amount plus fee) waits for a staff
    member's approval. No price: it waits (fail closed)."""
    return value is None or value > settings.WITHDRAWAL_APPROVAL_THRESHOLD


def above_four_eyes(value: Decimal | None) -> bool:
    """Whether `value` is above WITHDRAWAL_FOUR_EYES_ABOVE (never, when four eyes are switched off).
    No price: above (fail closed)."""
    above = settings.WITHDRAWAL_FOUR_EYES_ABOVE
    if above is None:
        return False
    return value is None or value > above


def needs_two_approvals(withdrawal: Withdrawal) -> bool:
    """Whether approving `withdrawal` takes two staff members.

    It is decided when the withdrawal is applied (`needs_two_approvals`, from its `approval_value`)
    and is only ever raised since then. It also takes two when the withdrawal's value at today's
    reference price is above WITHDRAWAL_FOUR_EYES_ABOVE, or when the asset has no price now: a
    price lowered after the withdrawal was applied (even to 0) never lets one person send it. And
    it takes two when the customer's withdrawals of the last WITHDRAWAL_FOUR_EYES_WINDOW_HOURS add
    up to more than the threshold (`recent_withdrawals_value`): a large sum split into pieces that
    one person could each approve alone."""
    if settings.WITHDRAWAL_FOUR_EYES_ABOVE is None:
        return False  # four eyes are switched off for this deployment
    if withdrawal.needs_two_approvals or withdrawal.approval_value is None:
        return True
    coin = Asset.objects.get(pk=withdrawal.network.coin_id)  # today's price, not a cached row's
    if above_four_eyes(approval_value_of(coin, withdrawal.amount + withdrawal.fee)):
        return True
    return above_four_eyes(recent_withdrawals_value(withdrawal))


def _family_ids(account_id: int) -> list[int]:
    """The customer an account belongs to: its master (or itself) and every sub-account of it."""
    master_id = User.objects.filter(pk=account_id).values_list("master_id", flat=True).get() or account_id
    return [master_id, *User.objects.filter(master_id=master_id).values_list("pk", flat=True)]


def recent_withdrawals_value(withdrawal: Withdrawal) -> Decimal | None:
    """What the customer of `withdrawal` asked to withdraw in the last
    WITHDRAWAL_FOUR_EYES_WINDOW_HOURS, `withdrawal` included.

    The customer is the withdrawal's account, that account's master and their sub-accounts. The sum
    adds each withdrawal's `approval_value` (amount plus fee in APPROVAL_CURRENCY when it was
    applied, as the thresholds measure) over every one not failed or rejected, whatever its stage:
    those waiting for approval count too, so two approvals of two pieces at once each count the
    other. None when one of them has no recorded value (no price when applied); every caller
    treats that as above the threshold."""
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


# --- the decisions ---------------------------------------------------------------------------------


def withdrawal_approve(*, withdrawal: Withdrawal, approved_by: User, reason: str | None) -> Withdrawal:
    """Send a withdrawal that waits for an operator, by a staff member with APPROVE_PERMISSION, for
    `reason`; audited ("withdrawal.approve") in the same transaction.

    Refused before anything changes: without a reason (ReasonRequired), by someone without the
    permission (StaffNotPermitted, a PermissionDenied), and while the withdrawal's account may not
    send funds (ValueError: reject it instead, or unfreeze the account first). A withdrawal that no
    longer waits (sent, rejected) is returned as it is, and nothing is recorded.

    Four eyes (needs_two_approvals): the first approval is recorded (first_approved_by) and the
    withdrawal keeps waiting; the second, by anyone else, sends it; the first approver approving
    again is refused (ApprovalRefused). The row is locked for the decision, so two concurrent
    approvals queue and the later one sees the earlier."""
    reason = require_reason(reason)
    require_permission(approved_by, APPROVE_PERMISSION, "You may not approve withdrawals.")
    if not policy.may_send(User.objects.get(pk=withdrawal.account_id)):
        raise ValueError(f"Withdrawal {withdrawal.pk}: {HELD_INFO.removeprefix('held: ')}; reject it instead.")
    with transaction.atomic():
        locked = Withdrawal.objects.select_for_update().select_related("network__coin").get(pk=withdrawal.pk)
        if locked.stage != WithdrawalStage.AWAITING_APPROVAL:
            withdrawal.refresh_from_db()
            return withdrawal  # decided already: nothing to approve
        with staff_action(
            actor=approved_by,
            action="withdrawal.approve",
            reason=reason,
            target=locked,
            fields=AUDITED_FIELDS,
        ) as draft:
            if needs_two_approvals(locked):
                if locked.first_approved_by_id is None:
                    Withdrawal.objects.filter(pk=locked.pk).update(
                        first_approved_by=approved_by,
                        first_approved_at=timezone.now(),
                        updated_at=timezone.now(),
                        needs_two_approvals=True,  # kept, whatever the prices or the day's sum do next
                    )
                    withdrawal.refresh_from_db()
                    draft.after = summary(withdrawal, AUDITED_FIELDS)
                    return withdrawal  # it waits for the second approver
                if locked.first_approved_by_id == approved_by.pk:
                    raise ApprovalRefused(
                        f"Withdrawal {withdrawal.pk} needs a second approver: you gave the first approval."
                    )
            if transition(
                withdrawal.pk,
                from_stages=[WithdrawalStage.AWAITING_APPROVAL],
                to_stage=WithdrawalStage.QUEUED,
                decided_by=approved_by,
            ):
                hand_to_worker(withdrawal.pk)
            withdrawal.refresh_from_db()
            draft.after = summary(withdrawal, AUDITED_FIELDS)
    return withdrawal


def withdrawal_reject(*, withdrawal: Withdrawal, rejected_by: User, reason: str | None) -> Withdrawal:
    """Reject a withdrawal that waits for an operator or for a worker (AWAITING_APPROVAL or QUEUED):
    it fails and its amount and fee return to the account. By a staff member with
    APPROVE_PERMISSION, for `reason` (kept as the withdrawal's info too); audited
    ("withdrawal.reject") in the same transaction. Refused like withdrawal_approve; one already
    sent or failed is returned as it is, and nothing is recorded."""
    reason = require_reason(reason)
    require_permission(rejected_by, APPROVE_PERMISSION, "You may not reject withdrawals.")
    open_stages = (WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED)
    withdrawal.refresh_from_db()
    if withdrawal.stage not in open_stages:
        return withdrawal
    with staff_action(
        actor=rejected_by,
        action="withdrawal.reject",
        reason=reason,
        target=withdrawal,
        fields=AUDITED_FIELDS,
    ) as draft:
        done = fail_and_release(withdrawal, info=reason[:255], decided_by=rejected_by, from_stages=open_stages)
        draft.after = summary(done, AUDITED_FIELDS)
    return done


RETRY_STAGES = (WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING)


def withdrawal_retry_by_staff(*, withdrawal: Withdrawal, retried_by: User, reason: str | None) -> bool:
    """Hand a queued or stuck broadcasting withdrawal to a worker again (settlement.withdrawal_retry,
    safe to repeat), by a staff member with APPROVE_PERMISSION, for `reason`; audited
    ("withdrawal.retry"). Refused like withdrawal_approve; one in another stage is left as it is,
    nothing recorded, and False returned."""
    reason = require_reason(reason)
    require_permission(retried_by, APPROVE_PERMISSION, "You may not retry withdrawals.")
    withdrawal.refresh_from_db()
    if withdrawal.stage not in RETRY_STAGES:
        return False
    with staff_action(
        actor=retried_by,
        action="withdrawal.retry",
        reason=reason,
        target=withdrawal,
        fields=AUDITED_FIELDS,
    ):
        withdrawal_retry(withdrawal=withdrawal)
    return True


# --- the settings, checked at start-up -------------------------------------------------------------


def check_thresholds(app_configs=None, **_kwargs) -> list[checks.CheckMessage]:
    """The wallet's system check (registered by WalletConfig.ready): the approval settings must make
    sense together, or the process does not start."""
    problems: list[checks.CheckMessage] = []
    approval = settings.WITHDRAWAL_APPROVAL_THRESHOLD
    four_eyes = settings.WITHDRAWAL_FOUR_EYES_ABOVE
    if approval < 0:
        problems.append(
            checks.Error(
                f"WITHDRAWAL_APPROVAL_THRESHOLD is negative ({approval}).",
                hint="Set it to 0 (every withdrawal waits for approval) or more.",
                id="wallet.E001",
            )
        )
    if four_eyes is not None and four_eyes < approval:
        problems.append(
            checks.Error(
                f"WITHDRAWAL_FOUR_EYES_ABOVE ({four_eyes}) is below WITHDRAWAL_APPROVAL_THRESHOLD ({approval}): "
                "a withdrawal worth between the two would need two approvers but would never wait for one.",
                hint="Raise WITHDRAWAL_FOUR_EYES_ABOVE to at least the approval threshold, or leave it empty "
                "to switch four eyes off.",
                id="wallet.E002",
            )
        )
    if settings.WITHDRAWAL_FOUR_EYES_WINDOW_HOURS < 0:
        problems.append(
            checks.Error(
                "WITHDRAWAL_FOUR_EYES_WINDOW_HOURS is negative.",
                hint="Set it to the hours of a customer's withdrawals that are added up (24 by default).",
                id="wallet.E003",
            )
        )
    return problems
