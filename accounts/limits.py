"""Daily, monthly and annual limits, from the ledger's limit counters (accounts/ledger/counters.py).

Periods are calendar periods in UTC (today, this month, this year). Movements count by business
type, valued in the tier's currency at each asset's current reference price:
- cash in: deposits (CHAIN_DEPOSIT, FIAT_DEPOSIT) and transfers received (P2P_TRANSFER in);
- cash out: withdrawals (CHAIN_WITHDRAWAL, FIAT_WITHDRAWAL) and transfers sent (P2P_TRANSFER out);
- total withdraw: withdrawals only.
The p2p blocks count transfers only (in, out, out). A withdrawal counts from the moment its amount
is held (free to locked) and stops counting if it is released, so pending withdrawals use the limit.
The counters are written by the posting itself, under the account's lock; the ledger check
recomputes the current periods' counters from the journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from accounts.ledger import counters
from accounts.ledger.posting import decimal_from_db, fetch_prepared
from accounts.models import LimitPeriod, LimitTier, User
from exchange.runtime.ttlcache import ReferenceCache

ZERO = Decimal(0)
SPAN_NAMES = {"D": "day", "M": "month", "Y": "year"}
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


# Read by every transfer and withdrawal: cached per process; a change of a tier or its limits reaches
# every process within REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py; LimitTier's and
# TierLimit's signals in accounts/apps.py, their managers for queryset writes).
tiers = ReferenceCache("limit tiers")


def _load_tier(tier_id: int | None) -> tuple[LimitTier | None, dict]:
    tier = (LimitTier.objects.filter(pk=tier_id) if tier_id else LimitTier.objects.filter(is_default=True)).first()
    return tier, ({limit.period: limit for limit in tier.limits.all()} if tier else {})


def tier_for(user: User) -> LimitTier | None:
    return tiers.get(user.limit_tier_id, lambda: _load_tier(user.limit_tier_id))[0]


def _tier_limits(user: User) -> dict:
    return tiers.get(user.limit_tier_id, lambda: _load_tier(user.limit_tier_id))[1]


@dataclass(frozen=True)
class LimitSnapshot:
    """An account's limit counters of the current periods, read in one statement together with its
    ledger `seq` (None without a ledger row): the counters are exactly those of that seq, so a
    check made on them still holds while the seq has not moved (`ledger.post(unchanged_since=)`)."""

    seq: int | None
    rows: tuple  # (span, asset code, reference price, deposits, withdrawals, p2p in, p2p out)


# The columns of a LimitSnapshot row (see snapshot_from_rows) and the joins that give them, for an
# account aliased `la` (its ledger row); the joins' parameters come from snapshot_join_params.
SNAPSHOT_COLUMNS = "la.seq, c.span, a.code, a.reference_price, c.deposits, c.withdrawals, c.p2p_in, c.p2p_out"
SNAPSHOT_JOINS = (
    " LEFT JOIN accounts_limitcounter c ON c.account_id = la.user_id AND ("
    + " OR ".join(["(c.span = %s AND c.period_start = %s)"] * len(counters.SPANS))
    + ") LEFT JOIN accounts_asset a ON a.id = c.asset_id"
)


def snapshot_join_params(now: datetime | None = None) -> list:
    return [v for key in counters.period_keys(now or timezone.now()) for v in key]


def snapshot_from_rows(rows: list[tuple]) -> LimitSnapshot:
    return LimitSnapshot(rows[0][0] if rows else None, tuple(tuple(row[1:]) for row in rows if row[1] is not None))


def snapshot(user: User, now: datetime | None = None) -> LimitSnapshot:
    """The account's LimitSnapshot, read now (the transfer path reads it with its recipient look-up)."""
    return snapshot_from_rows(
        fetch_prepared(
            f"SELECT {SNAPSHOT_COLUMNS} FROM accounts_ledgeraccount la{SNAPSHOT_JOINS} WHERE la.user_id = %s",
            [*snapshot_join_params(now), user.pk],
        )
    )


# What one unit of an unpriced asset counts as against the limits: more than any limit.
UNKNOWN_VALUE = Decimal("1e30")


def usage(
    user: User, *, currency: str, now: datetime | None = None, snap: LimitSnapshot | None = None
) -> dict[str, tuple[Usage, Usage]]:
    """Per span ("day", "month", "year"): (all movements usage, p2p-only usage), in `currency`,
    from the account's limit counters (a few rows, whatever the length of its history), read now
    or taken from `snap`."""
    rows = (snap or snapshot(user, now)).rows
    totals = {span: [ZERO] * 5 for span in SPAN_NAMES.values()}  # in, out, withdraw, p2p in, p2p out
    for span, code, price, deposits, withdrawals, p2p_in, p2p_out in rows:
        rate = Decimal(1) if code == currency else decimal_from_db(price or 0)
        if not rate > 0:
            # Movements of an asset without a price are worth an unknown amount: fail closed - they
            # use the whole of every limit (nothing more goes out until the asset is priced again),
            # never nothing (issue 25, finding 2: a price set to 0 must not lift a control).
            rate = UNKNOWN_VALUE
        deposits, withdrawals = decimal_from_db(deposits) * rate, decimal_from_db(withdrawals) * rate
        p2p_in, p2p_out = decimal_from_db(p2p_in) * rate, decimal_from_db(p2p_out) * rate
        bucket = totals[SPAN_NAMES[span]]
        bucket[0] += deposits + p2p_in
        bucket[1] += p2p_out - withdrawals
        bucket[2] -= withdrawals
        bucket[3] += p2p_in
        bucket[4] += p2p_out
    return {
        span: (Usage(max(t[0], ZERO), max(t[1], ZERO), max(t[2], ZERO)), Usage(t[3], t[4], t[4]))
        for span, t in totals.items()
    }


def limit_blocks(
    user: User, now: datetime | None = None, snap: LimitSnapshot | None = None
) -> dict[str, LimitBlock | None]:
    """The limit blocks of GET /openapi/v1/account, by period name."""
    tier = tier_for(user)
    if tier is None:
        return dict.fromkeys(LimitPeriod.values)
    used = usage(user, currency=tier.currency, now=now, snap=snap)
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


def outflow_refusal(
    user: User, asset, amount: Decimal, *, withdrawal: bool, snap: LimitSnapshot | None = None
) -> tuple[str, str] | None:
    """The first (period, limit name) that sending `amount` of `asset` out would exceed, or None.
    A withdrawal counts against total-withdraw and cash-out; a transfer against cash-out and the
    p2p blocks. Counters are read now, or taken from `snap`."""
    tier = tier_for(user)
    if tier is None:
        return None
    value = value_in(tier.currency, asset, amount)
    for period, block in limit_blocks(user, snap=snap).items():
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
