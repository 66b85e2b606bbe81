"""The service's own ledger accounts: the outside world (chain and fiat rails; may go negative,
it mirrors what customers brought in), fees, conversion liquidity, and equity (operator
adjustments and funding; may go negative). They are accounts like any other, so the whole book
sums to zero."""

from __future__ import annotations

import threading

from django.db import IntegrityError, connection, transaction

from accounts.models import LedgerAccount, SystemRole, User

NEGATIVE_ALLOWED = {SystemRole.WORLD, SystemRole.EQUITY}
_ids: dict[str, int] = {}
_lock = threading.Lock()


def system_account_id(role: SystemRole | str) -> int:
    role = SystemRole(role)
    found = _ids.get(role)
    if found is None:
        found = _ensure(role)
        if not connection.in_atomic_block:  # only a committed account may be remembered
            with _lock:
                _ids[role] = found
    return found


def _ensure(role: SystemRole) -> int:
    existing = User.objects.filter(system_role=role).values_list("id", flat=True).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            user = User.objects.create_user(
                email=f"system+{role.value}@ledger.internal", system_role=role, is_active=False
            )
            LedgerAccount.objects.update_or_create(
                user=user, defaults={"allow_negative": role in NEGATIVE_ALLOWED, "track_limits": False}
            )
            return user.id
    except IntegrityError:  # created concurrently
        return User.objects.get(system_role=role).id


def forget_cached_ids() -> None:
    """For tests that roll the database back."""
    with _lock:
        _ids.clear()
