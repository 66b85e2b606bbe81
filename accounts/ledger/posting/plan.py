"""What a posting will write, worked out in Python under the locks and before the write: per account
and asset the deltas and the next change-feed sequence, the journal entries, the limit counters'
increments; and the caller's LinkedRow, written with it. The PostgreSQL and SQLite writes both
carry out a `Plan`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import NamedTuple

from accounts.ledger import counters
from accounts.ledger.models import Bucket

ZERO = Decimal(0)


@dataclass(frozen=True)
class LinkedRow:
    """A business row written with the posting, in the posting's own statement (PostgreSQL) or
    right after it in its transaction (SQLite): `values` by column name of `model`, plus the
    posting's id in `posting_column` and its time in `time_column`. Its id comes back as
    `PostingResult.row_id`. A unique constraint on it that fails undoes the whole posting
    (IntegrityError)."""

    model: type
    values: dict[str, object]
    posting_column: str = "posting_id"
    time_column: str = "created_at"


class LockedAccount(NamedTuple):
    """An account's ledger row, as the lock statement read it."""

    seq: int  # the account's last change-feed sequence
    allow_negative: bool
    track_limits: bool
    may_send: bool


class BalanceDelta(NamedTuple):
    """What the posting changes in one account's balance of one asset; one change-feed row."""

    account_id: int
    asset_id: int
    asset: str  # the code, for the result (not written)
    delta_free: Decimal
    delta_locked: Decimal
    seq: int  # the change-feed row's per-account sequence
    allow_negative: bool


class EntryLine(NamedTuple):
    """One journal entry."""

    account_id: int
    asset_id: int
    bucket: str
    side: int  # +1 credit, -1 debit
    amount: Decimal  # positive


class CounterIncrement(NamedTuple):
    """What the posting adds to one account's limit counters of one asset, in each period."""

    account_id: int
    asset_id: int
    deposits: Decimal
    withdrawals: Decimal
    p2p_in: Decimal
    p2p_out: Decimal


class Period(NamedTuple):
    """A limit counters' period, as `counters.period_keys` gives them."""

    span: str
    start: date


class BalanceTotals(NamedTuple):
    free: Decimal
    locked: Decimal


@dataclass
class Plan:
    changes: list[BalanceDelta]  # in (account, asset id) order
    entries: list[EntryLine]
    counters: list[CounterIncrement]


class Written(NamedTuple):
    """What a write returns: the posting's id, every changed balance after it by (account id, asset
    id), and the id of the LinkedRow written with it (None without one)."""

    posting_id: int
    after: dict[tuple[int, int], BalanceTotals]
    row_id: int | None


def plan_posting(
    totals: dict[tuple[int, str, str], Decimal],
    kind: str,
    pairs: list[tuple[int, int, str]],
    accounts: dict[int, LockedAccount],
) -> Plan:
    """`totals`: the net amount per (account, asset code, bucket); `pairs`: the (account, asset id,
    asset code) the posting touches, sorted; `accounts`: the locked ledger rows."""
    next_seq = {account: locked.seq for account, locked in accounts.items()}
    changes, increments = [], []
    for account, asset, code in pairs:
        delta_free = totals.get((account, code, Bucket.FREE), ZERO)
        delta_locked = totals.get((account, code, Bucket.LOCKED), ZERO)
        next_seq[account] += 1
        locked = accounts[account]
        changes.append(
            BalanceDelta(account, asset, code, delta_free, delta_locked, next_seq[account], locked.allow_negative)
        )
        added = counters.increment(kind, delta_free) if locked.track_limits else None
        if added is not None:
            increments.append(CounterIncrement(account, asset, *added))
    ids = {code: asset for _, asset, code in pairs}
    entries = [
        EntryLine(account, ids[code], bucket, 1 if amount > 0 else -1, abs(amount))
        for (account, code, bucket), amount in sorted(totals.items())
    ]
    return Plan(changes, entries, increments)
