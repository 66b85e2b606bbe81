"""Ledger writes that are not part of another flow: operators' adjustments (four eyes) and funding.

An adjustment takes two staff members: one with PROPOSE_PERMISSION (Treasury, Administrators)
proposes it, another with CONFIRM_PERMISSION (Administrators) confirms it, which posts it. Each step
checks the acting staff member's permission and writes its audit row
(exchange.backoffice.services.staff_action) itself, whoever calls it; the admin
(accounts/ledger/admin.py) only calls these and shows what they did. The database refuses a
confirmation by the proposer too (ManualAdjustment's constraint)."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.ledger.models import AdjustmentStatus, Asset, BusinessType, ManualAdjustment, Posting
from accounts.ledger.posting import move, post
from accounts.ledger.system import system_account_id
from accounts.models import SystemRole, User
from exchange.backoffice.services import (
    StaffNotPermitted,
    require_permission,
    require_reason,
    staff_action,
    summary,
)

PROPOSE_PERMISSION = "accounts.add_manualadjustment"
CONFIRM_PERMISSION = "accounts.confirm_manualadjustment"
# The adjustment's fields the audit trail pictures before and after each step.
AUDITED_FIELDS = ("account", "asset", "amount", "reason", "status")


class AdjustmentRefused(ValueError):
    """A four-eyes rule refused the step (the proposer confirming, a decided adjustment again)."""


def adjustment_propose(
    *,
    account: User,
    asset: Asset,
    amount: Decimal,
    reason: str,
    proposed_by: User,
    request_id: uuid.UUID | None = None,
) -> ManualAdjustment:
    """Propose crediting (positive) or debiting (negative) `account` against the equity account, by
    a staff member with PROPOSE_PERMISSION (StaffNotPermitted otherwise); audited
    ("adjustment.propose"). No money moves: another staff member confirms it (adjustment_confirm),
    or it is cancelled.

    `request_id` (the admin form carries one, made when the form is shown) makes it idempotent: the
    same form submitted twice (a double click, a resend) proposes once and returns the first,
    without a second audit row."""
    reason = require_reason(reason)
    require_permission(proposed_by, PROPOSE_PERMISSION, "You may not propose adjustments.")
    if amount == 0:
        raise ValueError("An adjustment must move something.")
    if account.system_role is not None:
        raise ValueError("Adjustments are made to customer accounts.")
    if request_id is not None:
        existing = ManualAdjustment.objects.filter(request_id=request_id).first()
        if existing is not None:
            return existing
    try:
        with staff_action(actor=proposed_by, action="adjustment.propose", reason=reason) as draft:
            proposed = ManualAdjustment.objects.create(
                account=account,
                asset=asset,
                amount=amount,
                reason=reason,
                status=AdjustmentStatus.PROPOSED,
                request_id=request_id,
                created_by=proposed_by,
            )
            draft.target = proposed
            draft.after = summary(proposed, AUDITED_FIELDS)
        return proposed
    except IntegrityError:
        existing = ManualAdjustment.objects.filter(request_id=request_id).first() if request_id else None
        if existing is None:
            raise
        return existing


def may_confirm(user: User, adjustment: ManualAdjustment) -> bool:
    """Whether `user` may confirm `adjustment` now (the admin shows its button by this)."""
    return (
        adjustment.status == AdjustmentStatus.PROPOSED
        and adjustment.created_by_id != user.pk
        and user.is_active
        and user.is_staff
        and user.has_perm(CONFIRM_PERMISSION)
    )


def may_cancel(user: User, adjustment: ManualAdjustment) -> bool:
    """Whether `user` may cancel `adjustment` now: its proposer, or anyone who may confirm."""
    return (
        adjustment.status == AdjustmentStatus.PROPOSED
        and user.is_active
        and user.is_staff
        and (adjustment.created_by_id == user.pk or user.has_perm(CONFIRM_PERMISSION))
    )


def _decide(adjustment_id: int) -> ManualAdjustment:
    """The adjustment, locked (select_for_update) for the decision: concurrent decisions queue here
    and the later ones find it decided. Must run inside a transaction."""
    adjustment = ManualAdjustment.objects.select_for_update().select_related("asset").get(pk=adjustment_id)
    if adjustment.status != AdjustmentStatus.PROPOSED:
        raise AdjustmentRefused(f"Adjustment #{adjustment.pk} is already {adjustment.status.lower()}.")
    return adjustment


def adjustment_confirm(*, adjustment_id: int, confirmed_by: User, reason: str | None) -> ManualAdjustment:
    """The second pair of eyes: post a proposed adjustment, in one transaction, once, by a staff
    member with CONFIRM_PERMISSION who did not propose it, for `reason`; audited
    ("adjustment.confirm") in the same transaction.

    Refused before anything moves: without a reason (ReasonRequired); for an adjustment already
    confirmed or cancelled, or by its proposer (AdjustmentRefused); by anyone without the permission
    (StaffNotPermitted, a PermissionDenied). A debit beyond the free balance is refused (-1131) and
    leaves it proposed."""
    reason = require_reason(reason)
    with transaction.atomic():
        adjustment = _decide(adjustment_id)
        if adjustment.created_by_id == confirmed_by.pk:
            raise AdjustmentRefused(
                "The proposer cannot confirm their own adjustment (you proposed this adjustment): "
                "another staff member must."
            )
        require_permission(confirmed_by, CONFIRM_PERMISSION, "You may not confirm adjustments.")
        with staff_action(
            actor=confirmed_by,
            action="adjustment.confirm",
            reason=reason,
            target=adjustment,
            fields=AUDITED_FIELDS,
        ) as draft:
            equity = system_account_id(SystemRole.EQUITY)
            amount = adjustment.amount
            code = adjustment.asset.code
            legs = (
                move(equity, adjustment.account_id, code, amount)
                if amount > 0
                else move(adjustment.account_id, equity, code, -amount)
            )
            result = post(
                legs=legs,
                kind=BusinessType.OTHERS,
                reference=f"adjustment:{adjustment.pk}",  # unique: posted once whatever happens above
                memo=f"adjustment #{adjustment.pk} by {adjustment.created_by_id}, confirmed by "
                f"{confirmed_by.email}: {adjustment.reason}"[:255],
                actor_id=confirmed_by.pk,
            )
            ManualAdjustment.objects.filter(pk=adjustment.pk, status=AdjustmentStatus.PROPOSED).update(
                status=AdjustmentStatus.CONFIRMED,
                posting_id=result.posting_id,
                decided_by=confirmed_by,
                decided_at=timezone.now(),
                decision_reason=reason[:255],
            )
            adjustment.refresh_from_db()
            draft.after = {**summary(adjustment, AUDITED_FIELDS), "posting": adjustment.posting_id}
    return adjustment


def adjustment_cancel(*, adjustment_id: int, cancelled_by: User, reason: str | None) -> ManualAdjustment:
    """Drop a proposed adjustment, by its proposer or a staff member with CONFIRM_PERMISSION, for
    `reason`; audited ("adjustment.cancel"). Nothing was posted. Refused like adjustment_confirm."""
    reason = require_reason(reason)
    with transaction.atomic():
        adjustment = _decide(adjustment_id)
        if not may_cancel(cancelled_by, adjustment):
            raise StaffNotPermitted("Only the proposer or an Administrator may cancel a proposed adjustment.")
        with staff_action(
            actor=cancelled_by,
            action="adjustment.cancel",
            reason=reason,
            target=adjustment,
            fields=AUDITED_FIELDS,
        ) as draft:
            ManualAdjustment.objects.filter(pk=adjustment.pk, status=AdjustmentStatus.PROPOSED).update(
                status=AdjustmentStatus.CANCELLED,
                decided_by=cancelled_by,
                decided_at=timezone.now(),
                decision_reason=reason[:255],
            )
            adjustment.refresh_from_db()
            draft.after = {**summary(adjustment, AUDITED_FIELDS), "posting": adjustment.posting_id}
    return adjustment


def funding_post(
    *, account: User, asset_code: str, amount: Decimal, reference: str, kind: BusinessType = BusinessType.DISTRIBUTION
) -> bool:
    """Credit `account` from the equity account once per `reference` (demo world, promotions).
    Returns False when that reference was already posted."""
    if Posting.objects.filter(reference=reference).exists():
        return False
    post(
        legs=move(system_account_id(SystemRole.EQUITY), account.pk, asset_code, amount),
        kind=kind,
        reference=reference,
        memo="funding",
    )
    return True
