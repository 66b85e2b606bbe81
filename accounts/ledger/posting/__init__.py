"""`post()`: the one way any balance changes.

In one database transaction it locks the ledger rows of the accounts involved (always in account-id
order, so concurrent postings never deadlock), reads their balances, refuses a debit that would make
a customer balance negative (InsufficientBalance, accounts/ledger/errors.py), writes the new
balances, the posting, its entries, the change-feed rows and the limit counters. The statements are
written by hand: this is the hottest path of the service. On PostgreSQL a posting is two prepared
statements (lock; write everything), plus what the caller's guard reads; on SQLite (the embedded
mode) the write is separate statements.

- `api`: `post()`, its legs (and the shapes `move`, `hold`, `release`, `settle`), `PostingResult`;
  asset ids; the after-commit listeners;
- `plan`: what a posting writes, worked out under the locks before the write, and the caller's
  `LinkedRow` written with it;
- `postgres`: the lock and write statements on PostgreSQL;
- `sqlite`: the same on SQLite (the embedded mode);
- `prepared`: running a prepared statement, reading decimals back, array literals (the other hot
  paths use them too).
"""

from accounts.ledger.posting.api import (
    BalanceAfter,
    Leg,
    LinkedRow,
    PostingResult,
    after_commit_listeners,
    asset_id,
    forget_asset_ids,
    hold,
    move,
    post,
    release,
    settle,
)
from accounts.ledger.posting.prepared import array_literal, decimal_from_db, fetch_prepared

__all__ = [
    "BalanceAfter",
    "Leg",
    "LinkedRow",
    "PostingResult",
    "after_commit_listeners",
    "array_literal",
    "asset_id",
    "decimal_from_db",
    "fetch_prepared",
    "forget_asset_ids",
    "hold",
    "move",
    "post",
    "release",
    "settle",
]
