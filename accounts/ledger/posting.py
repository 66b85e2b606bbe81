"""`post()`: the one way any balance changes.

In one database transaction it locks the ledger rows of the accounts involved (always in account-id
order, so concurrent postings never deadlock), reads their balances, refuses a debit that would make
a customer balance negative (-1131), writes the new balances, the posting, its entries and the
change-feed rows. The statements are written by hand: this is the hottest path of the service and
the ORM's query building cost more than the database work here. They run on PostgreSQL and SQLite.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, localcontext

from django.db import connection, transaction
from django.utils import timezone

from accounts.ledger.models import QUANTUM, Asset, Bucket, BusinessType
from exchange.api.errors import InsufficientBalance

ZERO = Decimal(0)


@dataclass(frozen=True)
class Leg:
    """One side of a posting: `amount` added to (positive) or taken from (negative) the `bucket`
    ("F" free or "L" locked) of `account_id`'s `asset` balance."""

    account_id: int
    asset: str
    amount: Decimal
    bucket: str = Bucket.FREE


@dataclass(frozen=True)
class BalanceAfter:
    account_id: int
    asset: str
    free: Decimal
    locked: Decimal
    delta_free: Decimal
    delta_locked: Decimal
    seq: int


@dataclass(frozen=True)
class PostingResult:
    posting_id: int
    kind: str
    reference: str
    created_at: object
    balances: tuple[BalanceAfter, ...]


# --- shapes of common postings -------------------------------------------------------------------


def move(source_id: int, target_id: int, asset: str, amount: Decimal) -> list[Leg]:
    """Free to free between two accounts."""
    return [Leg(source_id, asset, -amount), Leg(target_id, asset, amount)]


def hold(account_id: int, asset: str, amount: Decimal) -> list[Leg]:
    """Free to locked in one account."""
    return [Leg(account_id, asset, -amount, Bucket.FREE), Leg(account_id, asset, amount, Bucket.LOCKED)]


def release(account_id: int, asset: str, amount: Decimal) -> list[Leg]:
    """Locked back to free in one account."""
    return [Leg(account_id, asset, -amount, Bucket.LOCKED), Leg(account_id, asset, amount, Bucket.FREE)]


def settle(account_id: int, target_id: int, asset: str, amount: Decimal) -> list[Leg]:
    """Locked in one account to free in another (a held amount paid out)."""
    return [Leg(account_id, asset, -amount, Bucket.LOCKED), Leg(target_id, asset, amount, Bucket.FREE)]


# --- assets ----------------------------------------------------------------------------------------

_asset_ids: dict[str, int] = {}
_asset_lock = threading.Lock()


def asset_id(code: str) -> int:
    """Asset ids never change once created, so they are cached for the life of the process."""
    found = _asset_ids.get(code)
    if found is None:
        found = Asset.objects.filter(code=code).values_list("id", flat=True).first()
        if found is None:
            raise ValueError(f"Unknown asset {code!r}")
        with _asset_lock:
            _asset_ids[code] = found
    return found


def forget_asset_ids() -> None:
    """For tests that roll the database back."""
    with _asset_lock:
        _asset_ids.clear()


# --- after-commit listeners (the streams relay registers one) --------------------------------------

after_commit_listeners: list[Callable[[PostingResult], None]] = []


def _notify(result: PostingResult) -> None:
    for listener in after_commit_listeners:
        listener(result)


# --- the posting function --------------------------------------------------------------------------


def _normalize(legs: Iterable[Leg]) -> dict[tuple[int, str, str], Decimal]:
    totals: dict[tuple[int, str, str], Decimal] = defaultdict(Decimal)
    per_asset: dict[str, Decimal] = defaultdict(Decimal)
    for leg in legs:
        if not isinstance(leg.amount, Decimal) or not leg.amount.is_finite():
            raise TypeError(f"Ledger amounts are finite Decimals, not {leg.amount!r}")
        if leg.amount != leg.amount.quantize(QUANTUM):
            raise ValueError(f"{leg.amount} has more than {-QUANTUM.as_tuple().exponent} decimal places")
        if leg.bucket not in (Bucket.FREE, Bucket.LOCKED):
            raise ValueError(f"Unknown bucket {leg.bucket!r}")
        totals[(leg.account_id, leg.asset, leg.bucket)] += leg.amount
        per_asset[leg.asset] += leg.amount
    unbalanced = {asset: total for asset, total in per_asset.items() if total != ZERO}
    if unbalanced:
        raise ValueError(f"Posting does not sum to zero: {unbalanced}")
    return {key: amount for key, amount in totals.items() if amount != ZERO}


def _placeholders(count: int, width: int) -> str:
    row = "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([row] * count)


def _decimal(value) -> Decimal:
    # PostgreSQL gives Decimal; SQLite gives int, float (only for values it could store exactly as
    # REAL, so repr() is exact) or text.
    return value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value))


def post(
    *,
    legs: Iterable[Leg],
    kind: BusinessType | str,
    reference: str,
    memo: str = "",
    actor_id: int | None = None,
    guard: Callable[[], None] | None = None,
) -> PostingResult:
    """Post a balanced set of legs atomically. Raises InsufficientBalance (-1131) when a debit
    would take a customer balance below zero, IntegrityError when `reference` was used before.

    `guard`, when given, runs once every account of the posting is locked and before anything is
    written: checks that must see all earlier movements of these accounts (limits, duplicate client
    ids) go there, so callers never take locks of their own out of the global order."""
    with localcontext(prec=60):  # exact arithmetic on NUMERIC(36, 18) whatever the thread's context
        return _post(legs, kind, reference, memo, actor_id, guard)


def _post(legs, kind, reference, memo, actor_id, guard=None) -> PostingResult:
    totals = _normalize(legs)
    if not totals:
        raise ValueError("A posting must move something")
    kind = BusinessType(kind).value
    account_ids = sorted({account for account, _, _ in totals})
    pairs = sorted({(account, asset_id(asset), asset) for account, asset, _ in totals})
    changes_per_account = defaultdict(int)
    for account, _, _ in pairs:
        changes_per_account[account] += 1
    now = timezone.now()
    vendor_lock = " FOR UPDATE" if connection.features.has_select_for_update else ""

    for attempt in (1, 2):
        try:
            return _post_locked(
                totals,
                kind,
                reference,
                memo,
                actor_id,
                account_ids,
                pairs,
                changes_per_account,
                now,
                vendor_lock,
                guard,
            )
        except _MissingLedgerAccounts:
            # Our savepoint is rolled back, so no lock of this posting is held while the rows are
            # created: creating them under other accounts' locks could deadlock with a twin posting.
            if attempt == 2:
                raise ValueError(f"Unknown account among {account_ids}") from None
            _open_ledger_accounts(account_ids)
    raise AssertionError("unreachable")


class _MissingLedgerAccounts(Exception):
    pass


def _open_ledger_accounts(account_ids: list[int]) -> None:
    """Create missing ledger rows (accounts normally get theirs when they are created)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_ledgeraccount (user_id, seq, allow_negative) SELECT id, 0, FALSE FROM accounts_user"
            " WHERE id IN (" + ", ".join(["%s"] * len(account_ids)) + ") ORDER BY id ON CONFLICT (user_id) DO NOTHING",
            account_ids,
        )


def _post_locked(
    totals, kind, reference, memo, actor_id, account_ids, pairs, changes_per_account, now, vendor_lock, guard
) -> PostingResult:
    with transaction.atomic():
        cursor = connection.cursor()
        accounts = _lock_accounts(cursor, account_ids, vendor_lock)
        if len(accounts) < len(account_ids):
            raise _MissingLedgerAccounts()
        if guard is not None:
            guard()

        cursor.execute(
            "UPDATE accounts_ledgeraccount SET seq = seq + CASE user_id "
            + " ".join(["WHEN %s THEN %s"] * len(account_ids))
            + " END WHERE user_id IN ("
            + ", ".join(["%s"] * len(account_ids))
            + ")",
            [v for account in account_ids for v in (account, changes_per_account[account])] + account_ids,
        )

        where = " OR ".join(["(account_id = %s AND asset_id = %s)"] * len(pairs))
        cursor.execute(
            f"SELECT account_id, asset_id, free, locked FROM accounts_balance WHERE {where}",
            [v for account, asset, _ in pairs for v in (account, asset)],
        )
        current = {(row[0], row[1]): (_decimal(row[2]), _decimal(row[3])) for row in cursor.fetchall()}

        after: list[BalanceAfter] = []
        next_seq = {account: accounts[account][0] for account in account_ids}
        for account, asset, code in pairs:
            free, locked = current.get((account, asset), (ZERO, ZERO))
            delta_free = totals.get((account, code, Bucket.FREE), ZERO)
            delta_locked = totals.get((account, code, Bucket.LOCKED), ZERO)
            new_free, new_locked = free + delta_free, locked + delta_locked
            if new_locked < ZERO or (new_free < ZERO and not accounts[account][1]):
                raise InsufficientBalance()
            next_seq[account] += 1
            after.append(BalanceAfter(account, code, new_free, new_locked, delta_free, delta_locked, next_seq[account]))

        ids = {code: asset for _, asset, code in pairs}
        cursor.execute(
            "INSERT INTO accounts_balance (account_id, asset_id, free, locked, allow_negative, updated_at) VALUES "
            + _placeholders(len(after), 6)
            + " ON CONFLICT (account_id, asset_id) DO UPDATE SET free = excluded.free, locked = excluded.locked,"
            " updated_at = excluded.updated_at",
            [v for b in after for v in (b.account_id, ids[b.asset], b.free, b.locked, accounts[b.account_id][1], now)],
        )

        cursor.execute(
            "INSERT INTO accounts_posting (kind, reference, memo, actor_id, created_at) VALUES (%s, %s, %s, %s, %s)"
            " RETURNING id",
            [kind, reference, memo[:255], actor_id, now],
        )
        posting_id = cursor.fetchone()[0]

        entries = sorted(totals.items())
        cursor.execute(
            "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount) VALUES "
            + _placeholders(len(entries), 6),
            [
                v
                for (account, code, bucket), amount in entries
                for v in (posting_id, account, ids[code], bucket, 1 if amount > 0 else -1, abs(amount))
            ],
        )

        cursor.execute(
            "INSERT INTO accounts_balancechange (account_id, asset_id, posting_id, kind, seq, delta_free, delta_locked,"
            " free_after, locked_after, created_at, published_at) VALUES " + _placeholders(len(after), 11),
            [
                v
                for b in after
                for v in (
                    b.account_id,
                    ids[b.asset],
                    posting_id,
                    kind,
                    b.seq,
                    b.delta_free,
                    b.delta_locked,
                    b.free,
                    b.locked,
                    now,
                    None,
                )
            ],
        )
        result = PostingResult(posting_id, kind, reference, now, tuple(after))
        if after_commit_listeners:
            transaction.on_commit(lambda: _notify(result))
    return result


def _lock_accounts(cursor, account_ids: list[int], vendor_lock: str) -> dict[int, tuple[int, bool]]:
    cursor.execute(
        "SELECT user_id, seq, allow_negative FROM accounts_ledgeraccount WHERE user_id IN ("
        + ", ".join(["%s"] * len(account_ids))
        + ") ORDER BY user_id"
        + vendor_lock,
        account_ids,
    )
    return {row[0]: (row[1], bool(row[2])) for row in cursor.fetchall()}
