"""The posting on SQLite (the embedded mode): the same lock and write as on PostgreSQL, as portable
separate statements, with the sums done in Python (SQLite adds NUMERIC columns in floating point).

SQLite has one writer at a time: the embedded mode's transactions take the write lock at BEGIN
(IMMEDIATE), so nothing changes between the reads and the writes here.
"""

from __future__ import annotations

from django.db import connection

from accounts.ledger import counters
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.posting.plan import (
    ZERO,
    BalanceTotals,
    CounterIncrement,
    LinkedRow,
    LockedAccount,
    Period,
    Plan,
    Written,
)
from accounts.ledger.posting.prepared import decimal_from_db


def _placeholders(count: int, width: int) -> str:
    row = "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([row] * count)


def lock_accounts(account_ids: list[int]) -> dict[int, LockedAccount]:
    """The ledger rows of `account_ids`, by account (the posting's first write takes the database's
    write lock, if BEGIN did not already)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT user_id, seq, allow_negative, track_limits, may_send FROM accounts_ledgeraccount"
            " WHERE user_id IN (" + ", ".join(["%s"] * len(account_ids)) + ") ORDER BY user_id",
            account_ids,
        )
        rows = cursor.fetchall()
    return {
        account: LockedAccount(seq, bool(allow_negative), bool(track_limits), bool(may_send))
        for account, seq, allow_negative, track_limits, may_send in rows
    }


def write(plan: Plan, kind: str, reference: str, memo: str, actor_id, now, row: LinkedRow | None = None) -> Written:
    """Carry out `plan`; InsufficientBalance before anything is written when a balance
    would go negative."""
    with connection.cursor() as cursor:
        where = " OR ".join(["(account_id = %s AND asset_id = %s)"] * len(plan.changes))
        cursor.execute(
            f"SELECT account_id, asset_id, free, locked FROM accounts_balance WHERE {where}",
            [v for change in plan.changes for v in (change.account_id, change.asset_id)],
        )
        current = {
            (account, asset): BalanceTotals(decimal_from_db(free), decimal_from_db(locked))
            for account, asset, free, locked in cursor.fetchall()
        }
        after: dict[tuple[int, int], BalanceTotals] = {}
        for change in plan.changes:
            free, locked = current.get((change.account_id, change.asset_id), (ZERO, ZERO))
            free, locked = free + change.delta_free, locked + change.delta_locked
            after[(change.account_id, change.asset_id)] = BalanceTotals(free, locked)
            if locked < ZERO or (free < ZERO and not change.allow_negative):
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
            [
                v
                for c in plan.changes
                for v in (c.account_id, c.asset_id, *after[(c.account_id, c.asset_id)], c.allow_negative, now)
            ],
        )
        last_seq = {}
        for change in plan.changes:
            last_seq[change.account_id] = change.seq
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
                for c in plan.changes
                for v in (
                    *(c.account_id, c.asset_id, posting_id, kind, c.seq, c.delta_free, c.delta_locked),
                    *after[(c.account_id, c.asset_id)],
                    *(now, None),
                )
            ],
        )
        if plan.counters:
            _add_counters(cursor, plan.counters, counters.period_keys(now))
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
    return Written(posting_id, after, row_id)


def _add_counters(cursor, increments: list[CounterIncrement], periods: list[tuple]) -> None:
    """Read the counters, add here, write the sums (SQLite would add NUMERIC columns in floating point)."""
    periods = [Period(*period) for period in periods]
    keys = [(i.account_id, i.asset_id, period.span, period.start) for i in increments for period in periods]
    where = " OR ".join(["(account_id = %s AND asset_id = %s AND span = %s AND period_start = %s)"] * len(keys))
    cursor.execute(
        "SELECT account_id, asset_id, span, period_start, deposits, withdrawals, p2p_in, p2p_out"
        f" FROM accounts_limitcounter WHERE {where}",
        [v for key in keys for v in key],
    )
    current = {
        (account, asset, span, str(start)): [decimal_from_db(v) for v in totals]
        for account, asset, span, start, *totals in cursor.fetchall()
    }
    values = []
    for increment in increments:
        added = (increment.deposits, increment.withdrawals, increment.p2p_in, increment.p2p_out)
        for period in periods:
            total = current.get((increment.account_id, increment.asset_id, period.span, str(period.start)), [ZERO] * 4)
            values.extend(
                (
                    *(increment.account_id, increment.asset_id, period.span, period.start),
                    *(t + a for t, a in zip(total, added, strict=True)),
                )
            )
    cursor.execute(
        "INSERT INTO accounts_limitcounter (account_id, asset_id, span, period_start, deposits, withdrawals,"
        " p2p_in, p2p_out) VALUES " + _placeholders(len(keys), 8) + " ON CONFLICT (account_id, span, period_start,"
        " asset_id) DO UPDATE SET deposits = excluded.deposits, withdrawals = excluded.withdrawals,"
        " p2p_in = excluded.p2p_in, p2p_out = excluded.p2p_out",
        values,
    )
