"""Daily, monthly and annual limits, computed from the journal.

Periods are calendar periods in UTC (today, this month, this year). Movements count by business
type, valued in the tier's currency at each asset's reference price:
- cash in: deposits (CHAIN_DEPOSIT, FIAT_DEPOSIT) and transfers received (P2P_TRANSFER in);
- cash out: withdrawals (CHAIN_WITHDRAWAL, FIAT_WITHDRAWAL) and transfers sent (P2P_TRANSFER out);
- total withdraw: withdrawals only.
The p2p blocks count transfers only (in, out, out). A withdrawal counts from the moment its amount
is held (free to locked) and stops counting if it is released, so pending withdrawals use the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Case, DecimalField, F, Sum, Value, When
from django.utils import timezone

from accounts.ledger.models import BusinessType, Entry
from accounts.models import LimitPeriod, LimitTier, User

ZERO = Decimal(0)
DEPOSITS = {BusinessType.CHAIN_DEPOSIT, BusinessType.FIAT_DEPOSIT}
WITHDRAWALS = {BusinessType.CHAIN_WITHDRAWAL, BusinessType.FIAT_WITHDRAWAL}
P2P = {BusinessType.P2P_TRANSFER}
PERIOD_SPAN = {
    LimitPeriod.DAILY: "day",
    LimitPeriod.MONTHLY: "month",
    LimitPeriod.ANNUALLY: "year",
    LimitPeriod.P2P_DAILY: "day",
    LimitPeriod.P2P_MONTHLY: "month",
    LimitPeriod.P2P_ANNUALLY: "year",
}


@dataclass(frozen=True)
class Usage:
    cash_in: Decimal = ZERO
    cash_out: Decimal = ZERO
    withdraw: Decimal = ZERO


@dataclass(frozen=True)
class LimitBlock:
    cash_in_limit: Decimal
    cash_in_remaining: Decimal
    cash_out_limit: Decimal
    cash_out_remaining: Decimal
    total_withdraw_limit: Decimal
    total_withdraw_remaining: Decimal


def period_starts(now: datetime) -> dict[str, datetime]:
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return {"day": day, "month": day.replace(day=1), "year": day.replace(month=1, day=1)}


def tier_for(user: User) -> LimitTier | None:
    if user.limit_tier_id:
        return user.limit_tier
    return LimitTier.objects.filter(is_default=True).first()


def usage(user: User, *, currency: str, now: datetime | None = None) -> dict[str, tuple[Usage, Usage]]:
    """Per span ("day", "month", "year"): (all movements usage, p2p-only usage), in `currency`."""
    starts = period_starts(now or timezone.now())
    amount_field = DecimalField(max_digits=36, decimal_places=18)

    def within(start):
        return Sum(
            Case(When(posting__created_at__gte=start, then=F("amount")), default=Value(ZERO), output_field=amount_field)
        )

    rows = (
        Entry.objects.filter(
            account=user,
            bucket="F",
            posting__created_at__gte=starts["year"],
            posting__kind__in=[*DEPOSITS, *WITHDRAWALS, *P2P],
        )
        .values("posting__kind", "side", "asset__code", "asset__reference_price")
        .annotate(day=within(starts["day"]), month=within(starts["month"]), year=Sum("amount"))
    )
    totals = {span: {"in": ZERO, "out": ZERO, "wd": ZERO, "p2p_in": ZERO, "p2p_out": ZERO} for span in starts}
    for row in rows:
        price = Decimal(1) if row["asset__code"] == currency else row["asset__reference_price"]
        kind, side = row["posting__kind"], row["side"]
        for span in starts:
            value = row[span] * price
            bucket = totals[span]
            if kind in DEPOSITS:
                bucket["in"] += value * side
            elif kind in WITHDRAWALS:
                bucket["out"] -= value * side
                bucket["wd"] -= value * side
            elif side > 0:
                bucket["in"] += value
                bucket["p2p_in"] += value
            else:
                bucket["out"] += value
                bucket["p2p_out"] += value
    return {
        span: (
            Usage(max(t["in"], ZERO), max(t["out"], ZERO), max(t["wd"], ZERO)),
            Usage(t["p2p_in"], t["p2p_out"], t["p2p_out"]),
        )
        for span, t in totals.items()
    }


def limit_blocks(user: User, now: datetime | None = None) -> dict[str, LimitBlock | None]:
    """The limit blocks of GET /openapi/v1/account, by period name."""
    tier = tier_for(user)
    if tier is None:
        return dict.fromkeys(LimitPeriod.values)
    used = usage(user, currency=tier.currency, now=now)
    configured = {limit.period: limit for limit in tier.limits.all()}
    blocks: dict[str, LimitBlock | None] = {}
    for period in LimitPeriod.values:
        limit = configured.get(period)
        if limit is None:
            blocks[period] = None
            continue
        all_usage, p2p_usage = used[PERIOD_SPAN[period]]
        spent = p2p_usage if period.startswith("p2p") else all_usage
        blocks[period] = LimitBlock(
            cash_in_limit=limit.cash_in_limit,
            cash_in_remaining=max(limit.cash_in_limit - spent.cash_in, ZERO),
            cash_out_limit=limit.cash_out_limit,
            cash_out_remaining=max(limit.cash_out_limit - spent.cash_out, ZERO),
            total_withdraw_limit=limit.total_withdraw_limit,
            total_withdraw_remaining=max(limit.total_withdraw_limit - spent.withdraw, ZERO),
        )
    return blocks
