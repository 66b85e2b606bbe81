"""Ledger writes that are not part of another flow: operators' adjustments (four eyes) and funding."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.ledger.models import AdjustmentStatus, Asset, BusinessType, ManualAdjustment, Posting
from accounts.ledger.posting import move, post
from accounts.ledger.system import system_account_id
from accounts.models import SystemRole, User


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
    """Propose crediting (positive) or debiting (negative) `account` against the equity account.
    No money moves: another staff member confirms it (adjustment_confirm), or it is cancelled.

    `request_id` (the admin form carries one, made when the form is shown) makes it idempotent: the
    same form submitted twice (a double click, a resend) proposes once and returns the first."""
    if not reason.strip():
        raise ValueError("An adjustment needs a reason.")
    if amount == 0:
        raise ValueError("An adjustment must move something.")
    if account.system_role is not None:
        raise ValueError("Adjustments are made to customer accounts.")
    if request_id is not None:
        existing = ManualAdjustment.objects.filter(request_id=request_id).first()
        if existing is not None:
            return existing
    try:
        with transaction.atomic():
            return ManualAdjustment.objects.create(
                account=account,
                asset=asset,
                amount=amount,
                reason=reason.strip(),
                status=AdjustmentStatus.PROPOSED,
                request_id=request_id,
                created_by=proposed_by,
            )
    except IntegrityError:
        existing = ManualAdjustment.objects.filter(request_id=request_id).first() if request_id else None
        if existing is None:
            raise
        return existing


def _decide(adjustment_id: int, by: User) -> ManualAdjustment:
    """The adjustment, locked (select_for_update) for the decision: concurrent decisions queue here
    and the later ones find it decided. Must run inside a transaction."""
    adjustment = ManualAdjustment.objects.select_for_update().select_related("asset").get(pk=adjustment_id)
    if adjustment.status != AdjustmentStatus.PROPOSED:
        raise AdjustmentRefused(f"Adjustment #{adjustment.pk} is already {adjustment.status.lower()}.")
    return adjustment


def adjustment_confirm(*, adjustment_id: int, confirmed_by: User, reason: str = "") -> ManualAdjustment:
    """The second pair of eyes: post a proposed adjustment, in one transaction, once. Refused
    (AdjustmentRefused) for its proposer and for an adjustment already confirmed or cancelled; a
    debit beyond the free balance is refused (-1131) and leaves it proposed."""
    with transaction.atomic():
        adjustment = _decide(adjustment_id, confirmed_by)
        if adjustment.created_by_id == confirmed_by.pk:
            raise AdjustmentRefused("The proposer cannot confirm their own adjustment: another staff member must.")
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
            memo=f"adjustment #{adjustment.pk} by {adjustment.created_by_id}, confirmed by {confirmed_by.email}: "
            f"{adjustment.reason}"[:255],
            actor_id=confirmed_by.pk,
        )
        ManualAdjustment.objects.filter(pk=adjustment.pk, status=AdjustmentStatus.PROPOSED).update(
            status=AdjustmentStatus.CONFIRMED,
            posting_id=result.posting_id,
            decided_by=confirmed_by,
            decided_at=timezone.now(),
            decision_reason=reason.strip()[:255],
        )
    adjustment.refresh_from_db()
    return adjustment


def adjustment_cancel(*, adjustment_id: int, cancelled_by: User, reason: str) -> ManualAdjustment:
    """Drop a proposed adjustment (its proposer may withdraw it too); nothing was posted."""
    if not reason.strip():
        raise ValueError("Cancelling an adjustment needs a reason.")
    with transaction.atomic():
        adjustment = _decide(adjustment_id, cancelled_by)
        ManualAdjustment.objects.filter(pk=adjustment.pk, status=AdjustmentStatus.PROPOSED).update(
            status=AdjustmentStatus.CANCELLED,
            decided_by=cancelled_by,
            decided_at=timezone.now(),
            decision_reason=reason.strip()[:255],
        )
    adjustment.refresh_from_db()
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
