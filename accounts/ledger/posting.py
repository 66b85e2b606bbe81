"""`post()`: the one way any balance changes.

In one database transaction it locks the ledger rows of the accounts involved (always in account-id
order, so concurrent postings never deadlock), reads their balances, refuses a debit that would make
a customer balance negative (-1131), writes the new balances, the posting, its entries, the
change-feed rows and the limit counters. The statements are written by hand: this is the hottest
path of the service. On PostgreSQL a posting is two prepared statements (lock; write everything),
plus what the caller's guard reads; on SQLite (the embedded mode) the write is separate statements.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, localcontext
from functools import partial

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from accounts.ledger import counters
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
    row_id: int | None = None  # the id of the LinkedRow written with the posting, if any


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
    unchanged_since: tuple[int, int] | None = None,
    row: LinkedRow | None = None,
    senders: Iterable[int] = (),
) -> PostingResult:
    """Post a balanced set of legs atomically. Raises InsufficientBalance (-1131) when a debit
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


@dataclass(frozen=True)
class _Locked:
    seq: int
    allow_negative: bool
    track_limits: bool
    may_send: bool


def _post(
    legs, kind, reference, memo, actor_id, guard=None, row=None, unchanged_since=None, senders=()
) -> PostingResult:
    totals = _normalize(legs)
    if not totals:
        raise ValueError("A posting must move something")
    kind = BusinessType(kind).value
    account_ids = sorted({account for account, _, _ in totals})
    pairs = sorted({(account, asset_id(asset), asset) for account, asset, _ in totals})
    now = timezone.now()
    write = _write_postgresql if connection.vendor == "postgresql" else _write_portable

    for attempt in (1, 2):
        try:
            # The outermost transaction when the caller has none (no savepoint round trips).
            with transaction.atomic():
                accounts = _lock_accounts(account_ids)
                if len(accounts) < len(account_ids):
                    raise _MissingLedgerAccounts()
                if any(not accounts[sender].may_send for sender in senders if sender in accounts):
                    from accounts.policy import AccountMayNotSend

                    raise AccountMayNotSend()
                if guard is not None and not (
                    unchanged_since is not None
                    and unchanged_since[0] in accounts
                    and accounts[unchanged_since[0]].seq == unchanged_since[1]
                ):
                    guard()
                result = write(_plan(totals, kind, pairs, accounts), kind, reference, memo[:255], actor_id, now, row)
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


def _open_ledger_accounts(account_ids: list[int]) -> None:
    """Create missing ledger rows (accounts normally get theirs when they are created)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_ledgeraccount (user_id, seq, allow_negative, track_limits)"
            " SELECT id, 0, FALSE, system_role IS NULL FROM accounts_user"
            " WHERE id IN (" + ", ".join(["%s"] * len(account_ids)) + ") ORDER BY id ON CONFLICT (user_id) DO NOTHING",
            account_ids,
        )


def fetch_prepared(sql: str, params) -> list[tuple]:
    """Run one of the ledger's hot statements on the current connection (and transaction) and return
    its rows. On PostgreSQL through a plain psycopg cursor (server-side binding) with `prepare=True`:
    parsed and planned once per connection (settings: DB_PREPARED_STATEMENTS). Database errors arrive
    as Django's."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy is a lookup
    with db.wrap_database_errors:
        if db.vendor != "postgresql":
            with db.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall()
        db.close_if_health_check_failed()  # as Django's own cursors do (DB_HEALTH_CHECKS)
        db.ensure_connection()
        with psycopg.Cursor(db.connection) as cursor:
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchall()


_LOCK_STATEMENTS: dict[int, str] = {}


def _lock_statement(count: int) -> str:
    """The lock statement for `count` accounts, one parameter each: with an array parameter
    PostgreSQL never settled on a generic plan and planned the statement on every call."""
    found = _LOCK_STATEMENTS.get(count)
    if found is None:
        found = _LOCK_STATEMENTS[count] = (
            "SELECT user_id, seq, allow_negative, track_limits, may_send FROM accounts_ledgeraccount"
            f" WHERE user_id IN ({', '.join(['%s::bigint'] * count)}) ORDER BY user_id FOR UPDATE"
        )
    return found


def _lock_accounts(account_ids: list[int]) -> dict[int, _Locked]:
    if connection.vendor == "postgresql":
        rows = fetch_prepared(_lock_statement(len(account_ids)), account_ids)
    else:  # SQLite: one writer at a time; the posting's first write takes the database lock
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT user_id, seq, allow_negative, track_limits, may_send FROM accounts_ledgeraccount"
                " WHERE user_id IN (" + ", ".join(["%s"] * len(account_ids)) + ") ORDER BY user_id",
                account_ids,
            )
            rows = cursor.fetchall()
    return {row[0]: _Locked(row[1], bool(row[2]), bool(row[3]), bool(row[4])) for row in rows}


@dataclass
class _Plan:
    """What a posting writes, computed before the write: per (account, asset) the deltas and the
    change-feed sequence, the entries, and the limit counters' increments."""

    changes: list[tuple[int, int, str, Decimal, Decimal, int, bool]]  # account, asset id, code, dF, dL, seq, neg
    entries: list[tuple[int, int, str, int, Decimal]]  # account, asset id, bucket, side, amount
    counters: list[tuple[int, int, Decimal, Decimal, Decimal, Decimal]]  # account, asset id, dep, wd, in, out
    codes: dict[int, str]


def _plan(totals, kind: str, pairs, accounts: dict[int, _Locked]) -> _Plan:
    next_seq = {account: locked.seq for account, locked in accounts.items()}
    changes, counter_rows = [], []
    for account, asset, code in pairs:
        delta_free = totals.get((account, code, Bucket.FREE), ZERO)
        delta_locked = totals.get((account, code, Bucket.LOCKED), ZERO)
        next_seq[account] += 1
        locked = accounts[account]
        changes.append((account, asset, code, delta_free, delta_locked, next_seq[account], locked.allow_negative))
        added = counters.increment(kind, delta_free) if locked.track_limits else None
        if added is not None:
            counter_rows.append((account, asset, *added))
    ids = {code: asset for _, asset, code in pairs}
    entries = [
        (account, ids[code], bucket, 1 if amount > 0 else -1, abs(amount))
        for (account, code, bucket), amount in sorted(totals.items())
    ]
    return _Plan(changes, entries, counter_rows, {asset: code for _, asset, code in pairs})


def _result(plan: _Plan, posting_id: int, kind: str, reference: str, now, after: dict, row_id=None) -> PostingResult:
    balances = []
    for account, asset, code, delta_free, delta_locked, seq, _ in plan.changes:
        free, locked = after[(account, asset)]
        balances.append(BalanceAfter(account, code, free, locked, delta_free, delta_locked, seq))
    return PostingResult(posting_id, kind, reference, now, tuple(balances), row_id)


# PostgreSQL: the whole write is one prepared statement. It reads the balances (stable: only
# postings write balances, the Balance model refusing ORM writes, and every posting holds its
# accounts' ledger locks, which this transaction holds) and writes only if no customer balance would
# go negative; otherwise it writes nothing and returns no posting id.
_PG_WRITE = """
WITH d AS (
    SELECT * FROM unnest(%(d_account)s::bigint[], %(d_asset)s::bigint[], %(d_free)s::numeric[],
        %(d_locked)s::numeric[], %(d_seq)s::bigint[], %(d_negative)s::boolean[])
        AS d(account_id, asset_id, delta_free, delta_locked, seq, allow_negative)
), n AS (
    SELECT d.*, COALESCE(b.free, 0) + d.delta_free AS free, COALESCE(b.locked, 0) + d.delta_locked AS locked
    FROM d LEFT JOIN accounts_balance b ON b.account_id = d.account_id AND b.asset_id = d.asset_id
), ok AS (
    SELECT bool_and(n.locked >= 0 AND (n.free >= 0 OR n.allow_negative)) AS ok FROM n
), p AS (
    INSERT INTO accounts_posting (kind, reference, memo, actor_id, created_at)
    SELECT %(kind)s::varchar, %(reference)s::varchar, %(memo)s::varchar, %(actor)s::bigint, %(now)s::timestamptz
    WHERE (SELECT ok FROM ok)
    RETURNING id
), b AS (
    INSERT INTO accounts_balance AS b (account_id, asset_id, free, locked, allow_negative, updated_at)
    SELECT n.account_id, n.asset_id, n.free, n.locked, n.allow_negative, %(now)s::timestamptz FROM n, p
    ON CONFLICT (account_id, asset_id) DO UPDATE
        SET free = excluded.free, locked = excluded.locked, updated_at = excluded.updated_at
), s AS (
    UPDATE accounts_ledgeraccount la SET seq = m.seq
    FROM (SELECT account_id, max(seq) AS seq FROM d GROUP BY account_id) m, p
    WHERE la.user_id = m.account_id
), e AS (
    INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount)
    SELECT p.id, x.account_id, x.asset_id, x.bucket, x.side, x.amount FROM p,
        unnest(%(e_account)s::bigint[], %(e_asset)s::bigint[], %(e_bucket)s::varchar[], %(e_side)s::smallint[],
            %(e_amount)s::numeric[]) AS x(account_id, asset_id, bucket, side, amount)
), c AS (
    INSERT INTO accounts_balancechange (account_id, asset_id, posting_id, kind, seq, delta_free, delta_locked,
        free_after, locked_after, created_at, published_at)
    SELECT n.account_id, n.asset_id, p.id, %(kind)s::varchar, n.seq, n.delta_free, n.delta_locked, n.free, n.locked,
        %(now)s::timestamptz, NULL FROM n, p
), l AS (
    INSERT INTO accounts_limitcounter AS l (account_id, asset_id, span, period_start, deposits, withdrawals, p2p_in,
        p2p_out)
    SELECT x.account_id, x.asset_id, t.span, t.period_start, x.deposits, x.withdrawals, x.p2p_in, x.p2p_out FROM p,
        unnest(%(l_account)s::bigint[], %(l_asset)s::bigint[], %(l_deposits)s::numeric[],
            %(l_withdrawals)s::numeric[], %(l_in)s::numeric[], %(l_out)s::numeric[])
            AS x(account_id, asset_id, deposits, withdrawals, p2p_in, p2p_out),
        unnest(%(t_span)s::varchar[], %(t_start)s::date[]) AS t(span, period_start)
    ON CONFLICT (account_id, span, period_start, asset_id) DO UPDATE SET
        deposits = l.deposits + excluded.deposits, withdrawals = l.withdrawals + excluded.withdrawals,
        p2p_in = l.p2p_in + excluded.p2p_in, p2p_out = l.p2p_out + excluded.p2p_out
)"""
_PG_WRITE_END = "\nSELECT (SELECT id FROM p), n.account_id, n.asset_id, n.free, n.locked, NULL FROM n\n"
_PG_WRITE_PLAIN = _PG_WRITE + _PG_WRITE_END  # the write without a LinkedRow
_PG_WRITE_ROW_END = """, r AS (
    INSERT INTO {table} ({columns}, {posting_column}, {time_column})
    SELECT x.*, p.id, %(now)s::timestamptz FROM p, unnest({values}) AS x RETURNING id
)
SELECT (SELECT id FROM p), n.account_id, n.asset_id, n.free, n.locked, (SELECT id FROM r) FROM n
"""

# Parameter casts of a LinkedRow's columns (PostgreSQL), by Django field type. Text is cast to text,
# never to varchar(n): an explicit cast to varchar(n) would silently cut a long value; the column's
# own assignment cast refuses it instead.
_ROW_CASTS = {
    "CharField": "text",
    "TextField": "text",
    "DecimalField": "numeric",
    "ForeignKey": "bigint",
    "OneToOneField": "bigint",
    "BigIntegerField": "bigint",
    "BigAutoField": "bigint",
    "IntegerField": "integer",
    "PositiveIntegerField": "integer",
    "SmallIntegerField": "smallint",
    "PositiveSmallIntegerField": "smallint",
    "BooleanField": "boolean",
    "DateTimeField": "timestamptz",
}
# The values arrive through unnest() of one-element arrays, not as constants in the select list: the
# planner folds a constant's conversion to the column's type at planning time, so an amount too
# large for NUMERIC(36, 18) would raise even when the posting is refused and nothing is inserted.
_row_statements: dict[tuple, str] = {}


def _row_statement(row: LinkedRow) -> str:
    key = (row.model, tuple(row.values), row.posting_column, row.time_column)
    found = _row_statements.get(key)
    if found is None:
        quote = connection.ops.quote_name
        casts = []
        for i, name in enumerate(row.values):
            field = row.model._meta.get_field(name)
            cast = _ROW_CASTS.get(field.get_internal_type())
            if cast is None:
                raise TypeError(f"{row.model.__name__}.{name} cannot be written with a posting")
            casts.append(f"ARRAY[%(r{i})s::{cast}]")
        found = _PG_WRITE + _PG_WRITE_ROW_END.format(
            table=quote(row.model._meta.db_table),
            columns=", ".join(quote(row.model._meta.get_field(name).column) for name in row.values),
            posting_column=quote(row.model._meta.get_field(row.posting_column).column),
            time_column=quote(row.model._meta.get_field(row.time_column).column),
            values=", ".join(casts),
        )
        _row_statements[key] = found
    return found


def _arrays(names: tuple[str | None, ...], rows: list[tuple]) -> dict[str, str]:
    """Columns of `rows` as PostgreSQL array literals (the statement casts and unnests them), named;
    a None name is left out. Literals cost a fraction of psycopg's list adaptation, which was the
    largest Python cost of a posting; only the ledger's own values go in (ids, Decimals, flags,
    dates, one-letter codes), never text from a request."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    return {name: _array_literal(column) for name, column in zip(names, columns, strict=True) if name is not None}


def _array_literal(values) -> str:
    items = []
    for value in values:
        if isinstance(value, bool):
            items.append("t" if value else "f")
        elif isinstance(value, int | Decimal | date):
            items.append(str(value))
        elif isinstance(value, str) and len(value) == 1 and value.isalpha():
            items.append(value)
        else:
            raise TypeError(f"{value!r} has no place in a ledger array")
    return "{" + ",".join(items) + "}"


def _write_postgresql(plan: _Plan, kind, reference, memo, actor_id, now, row=None) -> PostingResult:
    periods = counters.period_keys(now)
    params = {
        **_arrays(("d_account", "d_asset", None, "d_free", "d_locked", "d_seq", "d_negative"), plan.changes),
        **_arrays(("e_account", "e_asset", "e_bucket", "e_side", "e_amount"), plan.entries),
        **_arrays(("l_account", "l_asset", "l_deposits", "l_withdrawals", "l_in", "l_out"), plan.counters),
        **_arrays(("t_span", "t_start"), periods),
        "kind": kind,
        "reference": reference,
        "memo": memo,
        "actor": actor_id,
        "now": now,
    }
    if row is None:
        sql = _PG_WRITE_PLAIN
    else:
        sql = _row_statement(row)
        params.update({f"r{i}": value for i, value in enumerate(row.values.values())})
    rows = fetch_prepared(sql, params)
    posting_id = rows[0][0]
    if posting_id is None:
        raise InsufficientBalance()
    after = {(r[1], r[2]): (r[3], r[4]) for r in rows}
    return _result(plan, posting_id, kind, reference, now, after, rows[0][5])


def _write_portable(plan: _Plan, kind, reference, memo, actor_id, now, row=None) -> PostingResult:
    """The same write as separate statements (SQLite, the embedded mode)."""
    cursor = connection.cursor()
    where = " OR ".join(["(account_id = %s AND asset_id = %s)"] * len(plan.changes))
    cursor.execute(
        f"SELECT account_id, asset_id, free, locked FROM accounts_balance WHERE {where}",
        [v for change in plan.changes for v in change[:2]],
    )
    current = {(row[0], row[1]): (_decimal(row[2]), _decimal(row[3])) for row in cursor.fetchall()}
    after = {}
    for account, asset, _, delta_free, delta_locked, _, negative in plan.changes:
        free, locked = current.get((account, asset), (ZERO, ZERO))
        after[(account, asset)] = (free + delta_free, locked + delta_locked)
        if locked + delta_locked < ZERO or (free + delta_free < ZERO and not negative):
            raise InsufficientBalance()

    cursor.execute(
        "INSERT INTO accounts_posting (kind, reference, memo, actor_id, created_at) VALUES (%s, %s, %s, %s, %s)"
        " RETURNING id",
        [kind, reference, memo, actor_id, now],
    )
    posting_id = cursor.fetchone()[0]
    cursor.execute(
        "INSERT INTO accounts_balance (account_id, asset_id, free, locked, allow_negative, updated_at) VALUES "
        + _placeholders(len(plan.changes), 6)
        + " ON CONFLICT (account_id, asset_id) DO UPDATE SET free = excluded.free, locked = excluded.locked,"
        " updated_at = excluded.updated_at",
        [v for c in plan.changes for v in (c[0], c[1], *after[(c[0], c[1])], c[6], now)],
    )
    last_seq = {}
    for change in plan.changes:
        last_seq[change[0]] = change[5]
    cursor.execute(
        "UPDATE accounts_ledgeraccount SET seq = CASE user_id "
        + " ".join(["WHEN %s THEN %s"] * len(last_seq))
        + " END WHERE user_id IN ("
        + ", ".join(["%s"] * len(last_seq))
        + ")",
        [v for item in last_seq.items() for v in item] + list(last_seq),
    )
    cursor.execute(
        "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount) VALUES "
        + _placeholders(len(plan.entries), 6),
        [v for entry in plan.entries for v in (posting_id, *entry)],
    )
    cursor.execute(
        "INSERT INTO accounts_balancechange (account_id, asset_id, posting_id, kind, seq, delta_free, delta_locked,"
        " free_after, locked_after, created_at, published_at) VALUES " + _placeholders(len(plan.changes), 11),
        [
            v
            for account, asset, _, d_free, d_locked, seq, _ in plan.changes
            for v in (account, asset, posting_id, kind, seq, d_free, d_locked, *after[(account, asset)], now, None)
        ],
    )
    if plan.counters:
        _add_counters_portable(cursor, plan.counters, counters.period_keys(now))
    row_id = None
    if row is not None:
        meta, quote = row.model._meta, connection.ops.quote_name
        values = {**row.values, row.posting_column: posting_id, row.time_column: now}
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(meta.get_field(n).column) for n in values)})"
            f" VALUES ({', '.join(['%s'] * len(values))}) RETURNING id",
            [meta.get_field(n).get_db_prep_save(v, connection) for n, v in values.items()],
        )
        row_id = cursor.fetchone()[0]
    return _result(plan, posting_id, kind, reference, now, after, row_id)


def _add_counters_portable(cursor, rows, periods) -> None:
    """SQLite adds NUMERIC columns as floating point: read the counters, add here, write the sums
    (the embedded mode's transactions take the write lock at BEGIN, so nobody writes in between)."""
    keys = [(row[0], row[1], span, start) for row in rows for span, start in periods]
    where = " OR ".join(["(account_id = %s AND asset_id = %s AND span = %s AND period_start = %s)"] * len(keys))
    cursor.execute(
        "SELECT account_id, asset_id, span, period_start, deposits, withdrawals, p2p_in, p2p_out"
        f" FROM accounts_limitcounter WHERE {where}",
        [v for key in keys for v in key],
    )
    current = {
        (account, asset, span, str(start)): [_decimal(v) for v in values]
        for account, asset, span, start, *values in cursor.fetchall()
    }
    values = []
    for row in rows:
        for span, start in periods:
            total = current.get((row[0], row[1], span, str(start)), [ZERO] * 4)
            values.extend((row[0], row[1], span, start, *(t + added for t, added in zip(total, row[2:], strict=True))))
    cursor.execute(
        "INSERT INTO accounts_limitcounter (account_id, asset_id, span, period_start, deposits, withdrawals,"
        " p2p_in, p2p_out) VALUES " + _placeholders(len(keys), 8) + " ON CONFLICT (account_id, span, period_start,"
        " asset_id) DO UPDATE SET deposits = excluded.deposits, withdrawals = excluded.withdrawals,"
        " p2p_in = excluded.p2p_in, p2p_out = excluded.p2p_out",
        values,
    )
