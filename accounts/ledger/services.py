"""Ledger writes that are not part of another flow: operators' adjustments and funding."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import IntegrityError, transaction

from accounts.ledger.models import Asset, BusinessType, ManualAdjustment, Posting
from accounts.ledger.posting import move, post
from accounts.ledger.system import system_account_id
from accounts.models import SystemRole, User


def adjustment_create(
    *,
    account: User,
    asset: Asset,
    amount: Decimal,
    reason: str,
    created_by: User,
    request_id: uuid.UUID | None = None,
) -> ManualAdjustment:
    """Credit (positive) or debit (negative) `account` against the equity account, recorded with
    the reason and the operator. A debit beyond the free balance is refused (-1131).

    `request_id` (the admin form carries one, made when the form is shown) makes it idempotent: it is
    the posting's unique reference, so the same form submitted twice (a double click, a resend)
    posts once and returns the first adjustment. Without it, every call is a new adjustment."""
    if not reason.strip():
        raise ValueError("An adjustment needs a reason.")
    if amount == 0:
        raise ValueError("An adjustment must move something.")
    if account.system_role is not None:
        raise ValueError("Adjustments are made to customer accounts.")
    equity = system_account_id(SystemRole.EQUITY)
    legs = move(equity, account.pk, asset.code, amount) if amount > 0 else move(account.pk, equity, asset.code, -amount)
    reference = f"adjustment:{request_id or uuid.uuid4()}"
    try:
        with transaction.atomic():
            result = post(
                legs=legs,
                kind=BusinessType.OTHERS,
                reference=reference,
                memo=f"adjustment by {created_by.email}: {reason}"[:255],
                actor_id=created_by.pk,
            )
            return ManualAdjustment.objects.create(
                account=account,
                asset=asset,
                amount=amount,
                reason=reason,
                created_by=created_by,
                posting=Posting.objects.get(pk=result.posting_id),
            )
    except IntegrityError:
        existing = ManualAdjustment.objects.filter(posting__reference=reference).first() if request_id else None
        if existing is None:
            raise
        return existing


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
