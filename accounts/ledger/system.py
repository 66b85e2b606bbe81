"""The service's own ledger accounts: the outside world (chain and fiat rails; may go negative,
it mirrors what customers brought in), fees, conversion liquidity, and equity (operator
adjustments and funding; may go negative). They are accounts like any other, so the whole book
sums to zero.

A role may be split over several accounts, its *shards* (settings.HOUSE_ACCOUNT_SHARDS, per role;
1 when not set). Every posting locks the ledger rows of its accounts, so with one conversion
liquidity account every conversion of the whole exchange would queue on one lock; with shards, a
posting of customer N uses shard `N % shards` (`shard_account_id`) and conversions of different
customers run side by side. What the house holds in a role is the sum over its shards
(`role_account_ids`); the ledger check sums the whole book, shards included, to zero. Shards are
created by `seed_defaults()` after every migrate; raising the count adds shards, lowering it leaves
the extra ones out of new postings (their balances stay, visible in the admin, and operators move
them with an adjustment).
"""

from __future__ import annotations

import threading

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from accounts.models import LedgerAccount, SystemRole, User

NEGATIVE_ALLOWED = {SystemRole.WORLD, SystemRole.EQUITY}
_ids: dict[tuple[str, int], int] = {}
_lock = threading.Lock()


def shard_count(role: SystemRole | str) -> int:
    return max(1, int(getattr(settings, "HOUSE_ACCOUNT_SHARDS", {}).get(SystemRole(role).value, 1)))


def system_account_id(role: SystemRole | str, shard: int = 0) -> int:
    """The account of `role`'s shard `shard` (0: the role's first account)."""
    role = SystemRole(role)
    found = _ids.get((role, shard))
    if found is None:
        found = _ensure(role, shard)
        if not connection.in_atomic_block:  # only a committed account may be remembered
            with _lock:
                _ids[(role, shard)] = found
    return found


def shard_account_id(role: SystemRole | str, account_id: int) -> int:
    """The shard of `role` that postings of customer `account_id` use."""
    return system_account_id(role, account_id % shard_count(role))


def role_account_ids(role: SystemRole | str) -> list[int]:
    """Every shard of `role` in use, shard 0 first."""
    return [system_account_id(role, shard) for shard in range(shard_count(role))]


def _system_user(role: SystemRole | str, shard: int) -> User:
    """The (unsaved) account of `role`'s shard `shard`: no login, no usable password."""
    role = SystemRole(role)
    suffix = f"-{shard}" if shard else ""
    user = User(email=f"system+{role.value}{suffix}@ledger.internal", system_role=role, system_shard=shard)
    user.is_active = False
    user.set_unusable_password()
    return user


def _ledger_flags(role: SystemRole | str) -> dict[str, bool]:
    """A system account's ledger row: the world and equity may go negative; no limits."""
    return {"allow_negative": SystemRole(role) in NEGATIVE_ALLOWED, "track_limits": False}


def _ensure(role: SystemRole, shard: int) -> int:
    existing = User.objects.filter(system_role=role, system_shard=shard).values_list("id", flat=True).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            user = _system_user(role, shard)
            user.save()  # post_save opens its ledger row; its flags are set here
            LedgerAccount.objects.update_or_create(user=user, defaults=_ledger_flags(role))
            return user.id
    except IntegrityError:  # created concurrently
        return User.objects.get(system_role=role, system_shard=shard).id


def ensure_all() -> None:
    """Every shard of every role, in a handful of statements whatever the count (seed_defaults, after
    every migrate and every test database flush: one account at a time took half a second). Safe
    against a concurrent creator: the unique (role, shard) and the ledger row's key skip what exists."""
    wanted = {(role.value, shard) for role in SystemRole for shard in range(shard_count(role))}
    system = User.objects.filter(system_role__in=[role.value for role in SystemRole])
    missing = wanted - set(system.values_list("system_role", "system_shard"))
    if missing:  # no post_save in a bulk insert: the ledger rows below
        User.objects.bulk_create([_system_user(*each) for each in sorted(missing)], ignore_conflicts=True)
    opened = set(LedgerAccount.objects.filter(user__in=system).values_list("user_id", flat=True))
    LedgerAccount.objects.bulk_create(
        [
            LedgerAccount(user_id=pk, **_ledger_flags(role))
            for pk, role in system.values_list("pk", "system_role")
            if pk not in opened
        ],
        ignore_conflicts=True,
    )


def forget_cached_ids() -> None:
    """For tests that roll the database back."""
    with _lock:
        _ids.clear()
