"""Rows the service needs in every database: the default limit tier and the system accounts.
Idempotent; run after every migrate (post_migrate)."""

from decimal import Decimal

from accounts.models import LimitTier, TierLimit

DEFAULT_LIMITS = {"daily": Decimal("500000"), "monthly": Decimal("5000000"), "annually": Decimal("60000000")}


def seed_defaults() -> None:
    from accounts.ledger.system import ensure_all, forget_cached_ids

    # After a test database's flush (which re-sends post_migrate) the process may still remember
    # system accounts that were just truncated: a remembered shard would not be created again.
    forget_cached_ids()
    if not LimitTier.objects.filter(is_default=True).exists():
        tier = LimitTier.objects.create(name="Standard", currency="PHP", is_default=True)
        for period, amount in DEFAULT_LIMITS.items():
            TierLimit.objects.create(
                tier=tier, period=period, cash_in_limit=amount, cash_out_limit=amount, total_withdraw_limit=amount
            )
    ensure_all()  # every shard of every system role
