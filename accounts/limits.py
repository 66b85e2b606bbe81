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

from django.db import connection
from django.utils import timezone

from accounts.ledger.models import BusinessType
from accounts.ledger.posting import _decimal
from accounts.models import LimitPeriod, LimitTier, User
from exchange.ttlcache import TtlCache

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


tiers = TtlCache(10.0)


def _load_tier(tier_id: int | None) -> tuple[LimitTier | None, dict]:
    tier = (LimitTier.objects.filter(pk=tier_id) if tier_id else LimitTier.objects.filter(is_default=True)).first()
    return tier, ({limit.period: limit for limit in tier.limits.all()} if tier else {})


def tier_for(user: User) -> LimitTier | None:
    return tiers.get(user.limit_tier_id, lambda: _load_tier(user.limit_tier_id))[0]


def _tier_limits(user: User) -> dict:
    return tiers.get(user.limit_tier_id, lambda: _load_tier(user.limit_tier_id))[1]


def usage(user: User, *, currency: str, now: datetime | None = None) -> dict[str, tuple[Usage, Usage]]:
    """Per span ("day", "month", "year"): (all movements usage, p2p-only usage), in `currency`."""
    starts = period_starts(now or timezone.now())
    kinds = [str(k) for k in (*DEPOSITS, *WITHDRAWALS, *P2P)]
    if connection.vendor != "postgresql":
        return _totals_to_usage(_rows_summed_in_python(user, starts, kinds), currency, starts)
    # One hand-written statement: it runs on every transfer and withdrawal.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.kind, e.side, a.code, a.reference_price,"
            " SUM(CASE WHEN p.created_at >= %s THEN e.amount ELSE 0 END),"
            " SUM(CASE WHEN p.created_at >= %s THEN e.amount ELSE 0 END), SUM(e.amount)"
            " FROM accounts_entry e JOIN accounts_posting p ON p.id = e.posting_id"
            " JOIN accounts_asset a ON a.id = e.asset_id"
            " WHERE e.account_id = %s AND e.bucket = 'F' AND p.created_at >= %s"
            " AND p.kind IN (" + ", ".join(["%s"] * len(kinds)) + ")"
            " GROUP BY p.kind, e.side, a.code, a.reference_price",
            [starts["day"], starts["month"], user.pk, starts["year"], *kinds],
        )
        rows = [
            {
                "posting__kind": kind,
                "side": side,
                "asset__code": code,
                "asset__reference_price": _decimal(price),
                "day": _decimal(day),
                "month": _decimal(month),
                "year": _decimal(year),
            }
            for kind, side, code, price, day, month, year in cursor.fetchall()
        ]
    return _totals_to_usage(rows, currency, starts)


def _rows_summed_in_python(user: User, starts: dict, kinds: list[str]) -> list[dict]:
    """SQLite (embedded mode) sums NUMERIC columns as floating point: add the Decimals here."""
    from accounts.ledger.models import Entry

    grouped: dict[tuple, dict] = {}
    for kind, side, code, price, created, amount in Entry.objects.filter(
        account=user, bucket="F", posting__created_at__gte=starts["year"], posting__kind__in=kinds
    ).values_list("posting__kind", "side", "asset__code", "asset__reference_price", "posting__created_at", "amount"):
        row = grouped.setdefault(
            (kind, side, code),
            {
                "posting__kind": kind,
                "side": side,
                "asset__code": code,
                "asset__reference_price": price,
                "day": ZERO,
                "month": ZERO,
                "year": ZERO,
            },
        )
        row["year"] += amount
        if created >= starts["month"]:
            row["month"] += amount
        if created >= starts["day"]:
            row["day"] += amount
    return list(grouped.values())


def _totals_to_usage(rows: list[dict], currency: str, starts: dict) -> dict[str, tuple[Usage, Usage]]:
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
    configured = _tier_limits(user)
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


def value_in(currency: str, asset, amount: Decimal) -> Decimal:
    """`amount` of `asset` in `currency`, at the asset's reference price."""
    return amount if asset.code == currency else amount * asset.reference_price


def outflow_refusal(user: User, asset, amount: Decimal, *, withdrawal: bool) -> tuple[str, str] | None:
    """The first (period, limit name) that sending `amount` of `asset` out would exceed, or None.
    A withdrawal counts against total-withdraw and cash-out; a transfer against cash-out and the
    p2p blocks."""
    tier = tier_for(user)
    if tier is None:
        return None
    value = value_in(tier.currency, asset, amount)
    for period, block in limit_blocks(user).items():
        if block is None:
            continue
        p2p = period.startswith("p2p")
        if withdrawal and p2p:
            continue
        if withdrawal and value > block.total_withdraw_remaining:
            return period, "withdrawal"
        if value > block.cash_out_remaining:
            return period, "transfer" if p2p else "cash-out"
    return None
