"""`post()` and what it takes and returns: the legs (and the shapes of common postings), the
caller's LinkedRow (declared in plan.py, which the writes use too), the PostingResult; asset ids;
the after-commit listeners."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import partial

from django.db import connection, transaction
from django.utils import timezone

import accounts.ledger.posting.postgres as postgres
import accounts.ledger.posting.sqlite as sqlite
from accounts.ledger.errors import AccountMayNotSend
from accounts.ledger.models import QUANTUM, Asset, Bucket, BusinessType
from accounts.ledger.posting.plan import ZERO, LinkedRow, LockedAccount, Plan, Written, plan_posting


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
    row_id: int | None = None  # the id of the LinkedRow written with the posting, if any


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


def post(
    *,
    legs: Iterable[Leg],
    kind: BusinessType | str,
    reference: str,
    memo: str = "",
    actor_id: int | None = None,
    guard: Callable[[], None] | None = None,
    unchanged_since: tuple[int, int] | None = None,
    row: LinkedRow | None = None,
    senders: Iterable[int] = (),
) -> PostingResult:
    """Post a balanced set of legs atomically. Raises InsufficientBalance (accounts/ledger/errors.py) when a debit
    would take a customer balance below zero, IntegrityError when `reference` was used before.

    `guard`, when given, runs once every account of the posting is locked and before anything is
    written: checks that must see all earlier movements of these accounts (limits, duplicate client
    ids) go there, so callers never take locks of their own out of the global order. With
    `unchanged_since=(account, seq)` the guard is skipped when that account's ledger `seq` is still
    `seq` under the lock: the caller ran the same check, before the transaction, on a state read
    together with that seq, and no posting has touched the account since (every posting advances
    the seq of each account it moves). `row`, when given, is the business row that belongs with
    the posting (a transfer), written with it (see LinkedRow): a caller needs no transaction of its
    own around post() (which would cost a savepoint), and no round trip of its own. `senders` are the
    accounts money leaves at their owner's request: each must be allowed to send (accounts/policy.py),
    as its ledger row says under the lock (`may_send`, kept by the database from the account), else
    AccountMayNotSend (-1152) and nothing is written: a freeze committed before the lock is taken
    stops the posting, whatever the caller's cached view of the account."""
    with localcontext(prec=60):  # exact arithmetic on NUMERIC(36, 18) whatever the thread's context
        return _post(legs, kind, reference, memo, actor_id, guard, row, unchanged_since, tuple(senders))


def _normalize(legs: Iterable[Leg]) -> dict[tuple[int, str, str], Decimal]:
    """The net amount per (account, asset code, bucket), zeros left out. Amounts must be finite
    Decimals with at most QUANTUM's places, and sum to zero per asset."""
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


def _post(
    legs, kind, reference, memo, actor_id, guard=None, row=None, unchanged_since=None, senders=()
) -> PostingResult:
    totals = _normalize(legs)
    if not totals:
        raise ValueError("A posting must move something")
    kind = BusinessType(kind).value
    account_ids = sorted({account for account, _, _ in totals})
    pairs = sorted({(account, asset_id(asset), asset) for account, asset, _ in totals})
    write = postgres.write if connection.vendor == "postgresql" else sqlite.write

    for attempt in (1, 2):
        try:
            # The outermost transaction when the caller has none (no savepoint round trips).
            with transaction.atomic():
                accounts = _lock_accounts(account_ids)
                if len(accounts) < len(account_ids):
                    raise _MissingLedgerAccounts()
                if any(not accounts[sender].may_send for sender in senders if sender in accounts):
                    raise AccountMayNotSend()
                if guard is not None and not (
                    unchanged_since is not None
                    and unchanged_since[0] in accounts
                    and accounts[unchanged_since[0]].seq == unchanged_since[1]
                ):
                    guard()
                plan = plan_posting(totals, kind, pairs, accounts)
                # The posting's time is taken once its accounts are locked, right before the statement
                # that gives it its id: so created_at and the id's order differ by milliseconds, never by
                # a lock wait (the transaction history relies on it: POSTING_TIME_MARGIN).
                now = timezone.now()
                written = write(plan, kind, reference, memo[:255], actor_id, now, row)
                result = _result(plan, written, kind, reference, now)
                if after_commit_listeners:
                    transaction.on_commit(partial(_notify, result))
            return result
        except _MissingLedgerAccounts:
            # Our transaction (or savepoint) is rolled back, so no lock of this posting is held
            # while the rows are created: creating them under other accounts' locks could deadlock
            # with a twin posting.
            if attempt == 2:
                raise ValueError(f"Unknown account among {account_ids}") from None
            _open_ledger_accounts(account_ids)
    raise AssertionError("unreachable")


class _MissingLedgerAccounts(Exception):
    pass


def _lock_accounts(account_ids: list[int]) -> dict[int, LockedAccount]:
    """Lock the ledger rows of the posting's accounts, in account-id order, so concurrent postings
    never deadlock; the rows found, by account."""
    if connection.vendor == "postgresql":
        return postgres.lock_accounts(account_ids)
    return sqlite.lock_accounts(account_ids)


def _open_ledger_accounts(account_ids: list[int]) -> None:
    """Create missing ledger rows (accounts normally get theirs when they are created)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_ledgeraccount (user_id, seq, allow_negative, track_limits)"
            " SELECT id, 0, FALSE, system_role IS NULL FROM accounts_user"
            " WHERE id IN (" + ", ".join(["%s"] * len(account_ids)) + ") ORDER BY id ON CONFLICT (user_id) DO NOTHING",
            account_ids,
        )


def _result(plan: Plan, written: Written, kind: str, reference: str, now) -> PostingResult:
    balances = []
    for change in plan.changes:
        free, locked = written.after[(change.account_id, change.asset_id)]
        balances.append(
            BalanceAfter(
                change.account_id, change.asset, free, locked, change.delta_free, change.delta_locked, change.seq
            )
        )
    return PostingResult(written.posting_id, kind, reference, now, tuple(balances), written.row_id)
