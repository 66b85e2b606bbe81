"""The revocation log in the database, for processes without Redis (the embedded mode): an account
whose keys or state changed is appended in the change's own transaction, and every process's keyring
(accounts/keyring.py) reads the entries after its last position (the same reads as of the Redis log). With Redis
the same log lives in Redis (keyring.py's _LOG_APPEND/_LOG_READ); both keep LOG_LENGTH entries."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection, transaction

from accounts.models import RevocationLog, RevocationSequence

logger = logging.getLogger("accounts.keyring")

DATABASE_LOG_ID = "database"
# Entries kept (the Redis log's length too); the database log is trimmed every TRIM_EVERY appends.
LOG_LENGTH = 100_000
TRIM_EVERY = 1000


def log_revocation(account_id: int) -> None:
    """Without Redis: append `account_id` to the database's revocation log, in the caller's
    transaction (the change commits with its entry, or neither does). A failure is logged and
    leaves the change alone: other processes then fall back on API_KEY_CACHE_SECONDS."""
    try:
        with transaction.atomic():
            sequence = _next_sequence()
            RevocationLog.objects.create(seq=sequence, account_id=account_id)
            if sequence % TRIM_EVERY == 0:
                RevocationLog.objects.filter(seq__lte=sequence - LOG_LENGTH).delete()
    except DatabaseError:
        logger.exception("Could not append a revocation of account %s to the database's log", account_id)


def _next_sequence() -> int:
    """The counter, bumped under its row lock and read in one statement (RETURNING: PostgreSQL,
    SQLite >= 3.35); its row is created on first use (a flushed database)."""
    table = connection.ops.quote_name(RevocationSequence._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET value = value + 1 WHERE id = 1 RETURNING value")  # noqa: S608
        row = cursor.fetchone()
    if row is not None:
        return row[0]
    RevocationSequence.objects.create(pk=1, value=1)
    return 1


def read(last: int) -> tuple[int, list[int]]:
    """(the log's sequence, the accounts of its entries after `last`); no accounts when the
    reader is further behind than the log is long (it must then forget everything). The counter is
    read first: every entry up to it has committed."""
    sequence = RevocationSequence.objects.filter(pk=1).values_list("value", flat=True).first() or 0
    if sequence <= last or sequence - last > LOG_LENGTH:
        return sequence, []
    rows = list(RevocationLog.objects.filter(seq__gt=last, seq__lte=sequence).values_list("account_id", flat=True))
    return sequence, rows if len(rows) == sequence - last else []
