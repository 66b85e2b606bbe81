"""The posting on PostgreSQL: two prepared statements, the lock and the write.

The lock statement locks the accounts' ledger rows in id order and reads them (sequence, flags). The
write statement does the rest in one round trip: it reads the balances, checks that none goes
negative, and only then writes the posting, balances, entries, change-feed rows, sequences, limit
counters and the caller's LinkedRow.
"""

from __future__ import annotations

from django.db import connection

from accounts.ledger import counters
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.posting.plan import (
    BalanceDelta,
    BalanceTotals,
    CounterIncrement,
    EntryLine,
    LinkedRow,
    LockedAccount,
    Period,
    Plan,
    Written,
)
from accounts.ledger.posting.prepared import array_parameters, column_arrays, fetch_prepared

_lock_statements: dict[int, str] = {}


def _lock_statement(count: int) -> str:
    """The lock statement for `count` accounts, one parameter each: with an array parameter
    PostgreSQL never settled on a generic plan and planned the statement on every call."""
    found = _lock_statements.get(count)
    if found is None:
        found = _lock_statements[count] = (
            "SELECT user_id, seq, allow_negative, track_limits, may_send FROM accounts_ledgeraccount"
            f" WHERE user_id IN ({', '.join(['%s::bigint'] * count)}) ORDER BY user_id FOR UPDATE"
        )
    return found


def lock_accounts(account_ids: list[int]) -> dict[int, LockedAccount]:
    """Lock the ledger rows of `account_ids` (sorted) in that order; the rows found, by account."""
    rows = fetch_prepared(_lock_statement(len(account_ids)), account_ids)
    return {
        account: LockedAccount(seq, bool(allow_negative), bool(track_limits), bool(may_send))
        for account, seq, allow_negative, track_limits, may_send in rows
    }


# The whole write is one statement. It reads the balances (stable: only postings write balances, the
# Balance model refusing ORM writes, and every posting holds its accounts' ledger locks, which this
# transaction holds) and writes only if no customer balance would go negative; otherwise it writes
# nothing and returns no posting id. Its parameters are the plan's columns as arrays (`change_*` from
# BalanceDelta, `entry_*` from EntryLine, `counter_*` from CounterIncrement, `period_*` from Period:
# see _CHANGE_ARRAYS and the others below) and the posting's own fields.
_WRITE = """
WITH deltas AS (
    SELECT * FROM unnest(%(change_account_id)s::bigint[], %(change_asset_id)s::bigint[],
        %(change_delta_free)s::numeric[], %(change_delta_locked)s::numeric[], %(change_seq)s::bigint[],
        %(change_allow_negative)s::boolean[])
        AS deltas(account_id, asset_id, delta_free, delta_locked, seq, allow_negative)
), balances_after AS (
    SELECT deltas.*,
        COALESCE(balance.free, 0) + deltas.delta_free AS free,
        COALESCE(balance.locked, 0) + deltas.delta_locked AS locked
    FROM deltas LEFT JOIN accounts_balance balance
        ON balance.account_id = deltas.account_id AND balance.asset_id = deltas.asset_id
), sufficient AS (
    SELECT bool_and(locked >= 0 AND (free >= 0 OR allow_negative)) AS ok FROM balances_after
), posting AS (
    INSERT INTO accounts_posting (kind, reference, memo, actor_id, created_at)
    SELECT %(kind)s::varchar, %(reference)s::varchar, %(memo)s::varchar, %(actor)s::bigint, %(now)s::timestamptz
    WHERE (SELECT ok FROM sufficient)
    RETURNING id
),
-- Every CTE below joins `posting`, which is empty when the balance check refused the posting: then
-- none of them writes anything, the statement returns no posting id, and the transaction stays usable.
balances_written AS (
    INSERT INTO accounts_balance AS balance (account_id, asset_id, free, locked, allow_negative, updated_at)
    SELECT account_id, asset_id, free, locked, allow_negative, %(now)s::timestamptz FROM balances_after, posting
    ON CONFLICT (account_id, asset_id) DO UPDATE
        SET free = excluded.free, locked = excluded.locked, updated_at = excluded.updated_at
), sequences_advanced AS (
    UPDATE accounts_ledgeraccount ledger SET seq = newest.seq
    FROM (SELECT account_id, max(seq) AS seq FROM deltas GROUP BY account_id) newest, posting
    WHERE ledger.user_id = newest.account_id
), entries_written AS (
    INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount)
    SELECT posting.id, entry.account_id, entry.asset_id, entry.bucket, entry.side, entry.amount FROM posting,
        unnest(%(entry_account_id)s::bigint[], %(entry_asset_id)s::bigint[], %(entry_bucket)s::varchar[],
            %(entry_side)s::smallint[], %(entry_amount)s::numeric[])
            AS entry(account_id, asset_id, bucket, side, amount)
), feed_rows_written AS (
    INSERT INTO accounts_balancechange (account_id, asset_id, posting_id, kind, seq, delta_free, delta_locked,
        free_after, locked_after, created_at, published_at)
    SELECT account_id, asset_id, posting.id, %(kind)s::varchar, seq, delta_free, delta_locked, free, locked,
        %(now)s::timestamptz, NULL
    FROM balances_after, posting
), counters_added AS (
    INSERT INTO accounts_limitcounter AS counter (account_id, asset_id, span, period_start, deposits, withdrawals,
        p2p_in, p2p_out)
    SELECT increment.account_id, increment.asset_id, period.span, period.period_start, increment.deposits,
        increment.withdrawals, increment.p2p_in, increment.p2p_out
    FROM posting,
        unnest(%(counter_account_id)s::bigint[], %(counter_asset_id)s::bigint[], %(counter_deposits)s::numeric[],
            %(counter_withdrawals)s::numeric[], %(counter_p2p_in)s::numeric[], %(counter_p2p_out)s::numeric[])
            AS increment(account_id, asset_id, deposits, withdrawals, p2p_in, p2p_out),
        unnest(%(period_span)s::varchar[], %(period_start)s::date[]) AS period(span, period_start)
    ON CONFLICT (account_id, span, period_start, asset_id) DO UPDATE SET
        deposits = counter.deposits + excluded.deposits, withdrawals = counter.withdrawals + excluded.withdrawals,
        p2p_in = counter.p2p_in + excluded.p2p_in, p2p_out = counter.p2p_out + excluded.p2p_out
)"""
# What the statement returns, one row per changed balance: the posting id (NULL: refused), the
# account, the asset, free and locked after, and the LinkedRow's id (NULL without one).
_WRITE_END = "\nSELECT (SELECT id FROM posting), account_id, asset_id, free, locked, NULL FROM balances_after\n"
_WRITE_PLAIN = _WRITE + _WRITE_END  # the write without a LinkedRow
_WRITE_LINKED_ROW_END = """, linked_row_written AS (
    INSERT INTO {table} ({columns}, {posting_column}, {time_column})
    SELECT linked.*, posting.id, %(now)s::timestamptz FROM posting, unnest({values}) AS linked RETURNING id
)
SELECT (SELECT id FROM posting), account_id, asset_id, free, locked, (SELECT id FROM linked_row_written)
FROM balances_after
"""

# Parameter casts of a LinkedRow's columns, by Django field type. Text is cast to text, never to
# varchar(n): an explicit cast to varchar(n) would silently cut a long value; the column's own
# assignment cast refuses it instead.
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
_linked_row_statements: dict[tuple, str] = {}


def _linked_row_statement(row: LinkedRow) -> str:
    key = (row.model, tuple(row.values), row.posting_column, row.time_column)
    found = _linked_row_statements.get(key)
    if found is None:
        quote = connection.ops.quote_name
        casts = []
        for i, name in enumerate(row.values):
            field = row.model._meta.get_field(name)
            cast = _ROW_CASTS.get(field.get_internal_type())
            if cast is None:
                raise TypeError(f"{row.model.__name__}.{name} cannot be written with a posting")
            casts.append(f"ARRAY[%(r{i})s::{cast}]")
        found = _WRITE + _WRITE_LINKED_ROW_END.format(
            table=quote(row.model._meta.db_table),
            columns=", ".join(quote(row.model._meta.get_field(name).column) for name in row.values),
            posting_column=quote(row.model._meta.get_field(row.posting_column).column),
            time_column=quote(row.model._meta.get_field(row.time_column).column),
            values=", ".join(casts),
        )
        _linked_row_statements[key] = found
    return found


# The parameter names of the plan's columns. The asset code is text (never in an array literal) and
# the write does not need it.
_CHANGE_ARRAYS = array_parameters("change", BalanceDelta, leave_out=frozenset({"asset"}))
_ENTRY_ARRAYS = array_parameters("entry", EntryLine)
_COUNTER_ARRAYS = array_parameters("counter", CounterIncrement)
_PERIOD_ARRAYS = array_parameters("period", Period)


def write(plan: Plan, kind: str, reference: str, memo: str, actor_id, now, row: LinkedRow | None = None) -> Written:
    """Carry out `plan` in one statement; InsufficientBalance and nothing written when a
    balance would go negative."""
    params = {
        **column_arrays(_CHANGE_ARRAYS, plan.changes),
        **column_arrays(_ENTRY_ARRAYS, plan.entries),
        **column_arrays(_COUNTER_ARRAYS, plan.counters),
        **column_arrays(_PERIOD_ARRAYS, counters.period_keys(now)),
        "kind": kind,
        "reference": reference,
        "memo": memo,
        "actor": actor_id,
        "now": now,
    }
    if row is None:
        sql = _WRITE_PLAIN
    else:
        sql = _linked_row_statement(row)
        params.update({f"r{i}": value for i, value in enumerate(row.values.values())})
    rows = fetch_prepared(sql, params)
    posting_id, *_, row_id = rows[0]
    if posting_id is None:
        raise InsufficientBalance()
    after = {(account, asset): BalanceTotals(free, locked) for _, account, asset, free, locked, _ in rows}
    return Written(posting_id, after, row_id)
