"""Helpers for the ledger's hand-written statements, also used by the other hot paths (the keyring,
the transfer look-up, the limits): running a prepared statement, reading decimals back, passing
columns of values as PostgreSQL array literals."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date
from decimal import Decimal
from typing import NamedTuple

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections


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


def decimal_from_db(value) -> Decimal:
    """A NUMERIC column's value as a Decimal, exactly. PostgreSQL gives Decimal; SQLite gives int,
    float (only for values it could store exactly as REAL, so repr() is exact) or text."""
    return value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value))


def array_literal(values: Iterable) -> str:
    """`values` as the text of a PostgreSQL array (the statement casts it, e.g. `::numeric[]`).
    Only the ledger's own values go in (ids, Decimals, flags, dates, one-letter codes), never text
    from a request: anything else is a TypeError."""
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


def array_parameters(
    prefix: str, row_type: type[NamedTuple], *, leave_out: frozenset[str] = frozenset()
) -> tuple[str | None, ...]:
    """The parameter names of `row_type`'s fields for column_arrays: `<prefix>_<field>`, None for the
    fields in `leave_out`. Worked out once per statement, not per call."""
    return tuple(None if field in leave_out else f"{prefix}_{field}" for field in row_type._fields)


def column_arrays(names: tuple[str | None, ...], rows: Sequence[tuple]) -> dict[str, str]:
    """The columns of `rows` as array literals, by the parameter names (array_parameters) of their
    fields; a None name is left out. The statement unnests the arrays into rows again. Literals cost
    a fraction of psycopg's list adaptation, which was the largest Python cost of a posting."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    return {name: array_literal(column) for name, column in zip(names, columns, strict=True) if name is not None}
