"""Limit counters: what a posting adds to its accounts' running totals per calendar period.

A movement counts against limits by its posting's business type, on the free bucket only (a
withdrawal's hold moves free to locked and counts from then on; a release moves it back and stops
counting; the settlement leaves locked and changes nothing more):
- deposits (CHAIN_DEPOSIT, FIAT_DEPOSIT): net free change, signed;
- withdrawals (CHAIN_WITHDRAWAL, FIAT_WITHDRAWAL): net free change, signed (negative is out);
- transfers (P2P_TRANSFER): received into p2p_in, sent into p2p_out (both positive).
Periods are calendar periods in UTC: the day, the month and the year of the posting.

Pure functions: `post()` writes their result in the posting's statement, the ledger check and the
migration that introduced the counters recompute them from the journal with the same rules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime
from decimal import Decimal

ZERO = Decimal(0)
DEPOSITS = frozenset({"CHAIN_DEPOSIT", "FIAT_DEPOSIT"})
WITHDRAWALS = frozenset({"CHAIN_WITHDRAWAL", "FIAT_WITHDRAWAL"})
P2P = frozenset({"P2P_TRANSFER"})
COUNTED = DEPOSITS | WITHDRAWALS | P2P
SPANS = ("D", "M", "Y")


def period_keys(moment: datetime) -> list[tuple[str, date]]:
    """(span, first day of the period) of the UTC day, month and year `moment` falls in."""
    day = moment.date() if moment.tzinfo is None else moment.astimezone(UTC).date()
    return [("D", day), ("M", day.replace(day=1)), ("Y", day.replace(month=1, day=1))]


def increment(kind: str, delta_free: Decimal) -> tuple[Decimal, Decimal, Decimal, Decimal] | None:
    """(deposits, withdrawals, p2p_in, p2p_out) added by a posting of `kind` that changed one
    account's free balance of one asset by `delta_free`; None when it counts for nothing."""
    if kind not in COUNTED or delta_free == ZERO:
        return None
    if kind in DEPOSITS:
        return delta_free, ZERO, ZERO, ZERO
    if kind in WITHDRAWALS:
        return ZERO, delta_free, ZERO, ZERO
    return (ZERO, ZERO, delta_free, ZERO) if delta_free > ZERO else (ZERO, ZERO, ZERO, -delta_free)


def from_journal(
    rows: Iterable[tuple[int, int, str, datetime, Decimal]], periods: Iterable[tuple[str, date]] | None = None
) -> dict[tuple[int, int, str, date], list[Decimal]]:
    """Counters recomputed from journal rows (account, asset id, posting kind, posting time, net
    signed free-bucket change of that posting for that account and asset). With `periods`, only
    those (span, start) keys are kept."""
    wanted = set(periods) if periods is not None else None
    totals: dict[tuple[int, int, str, date], list[Decimal]] = defaultdict(lambda: [ZERO, ZERO, ZERO, ZERO])
    for account, asset, kind, created, delta in rows:
        added = increment(kind, delta)
        if added is None:
            continue
        for key in period_keys(created):
            if wanted is not None and key not in wanted:
                continue
            row = totals[(account, asset, *key)]
            for i, value in enumerate(added):
                row[i] += value
    return dict(totals)
