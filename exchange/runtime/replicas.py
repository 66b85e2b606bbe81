"""Reads of history on a hot standby (docs/scaling.md, "Reads of history on replicas").

Opt-in: with `DATABASE_REPLICA_URL` set, the settings add the database alias `replica`; without it
`history_read` runs every read on `default` and touches nothing else (no Redis, no query: the
statement counts are those of a service without replicas).

There is no database router: a router answers for every read, those inside a service's transaction
and under the ledger's locks included. Only the history selectors that docs/scaling.md lists call
`history_read`, around their own queries, naming the accounts whose writes the caller must see. It
answers `replica` only when all of these hold, else `default`:

- no transaction is open on `default` (a read inside a write's transaction sees the primary);
- none of those accounts posted within `REPLICA_STICKY_SECONDS` (the sticky rule: a posting marks
  its accounts in Redis after commit, `rw:<account id>` with that TTL; Redis unreachable: primary);
- the replica's replay lag, read at most every `REPLICA_CHECK_SECONDS` per process, is below
  `REPLICA_MAX_LAG_SECONDS` (the lag guard), and the replica answered its last look.

A replica that fails (down, cut, a query cancelled by a conflict with recovery) is skipped for
`REPLICA_DOWN_SECONDS` and the read runs again on the primary: the client never sees it.

The sticky TTL is at least the lag bound plus the check interval (the settings make it so): a
posting older than that is older than anything the replica may still lack when the guard lets it
be read, so an account reads its own writes on either database.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, connections

from exchange.runtime.outage import Outage

REPLICA = "replica"
PRIMARY = "default"
STICKY_PREFIX = "rw:"

T = TypeVar("T")
logger = logging.getLogger(__name__)
_replica_outage = Outage(logger, "History replica unavailable; history read on the primary", level=logging.WARNING)
_sticky_outage = Outage(logger, "Redis unavailable for the replica's sticky rule", level=logging.WARNING)

# Lag in seconds of the replica, given the primary's WAL position read just before: 0 when the
# standby has replayed up to it (an idle primary sends nothing, so the age of the last replayed
# commit says nothing then), else the age of the last commit it replayed - everything the standby
# lacks was committed after that one. Not "replayed all it received": a standby cut off from its
# primary has received nothing new and would look current until wal_receiver_timeout (60 s). On a
# server that is not in recovery (prefer-standby fell back to the primary) it is 0.
_PRIMARY_LSN_SQL = "SELECT pg_current_wal_lsn()::text"
_LAG_SQL = """
SELECT CASE
    WHEN NOT pg_is_in_recovery() THEN 0
    WHEN pg_last_wal_replay_lsn() >= %s::pg_lsn THEN 0
    ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 1e9)
END
"""


class _Health:
    """What this process last learnt of the replica: usable or not, until when."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.usable = False
        self.until = 0.0  # time.monotonic() after which the replica is looked at again
        self.lag: float | None = None

    def forget(self) -> None:
        with self.lock:
            self.usable, self.until, self.lag = False, 0.0, None


_health = _Health()
_redis_lock = threading.Lock()
_redis: dict[str, object] = {}


def configured() -> bool:
    """A replica alias, and the Redis the sticky rule keeps its marks in (without it no account's
    own writes could be told apart: everything stays on the primary)."""
    return REPLICA in connections.settings and bool(settings.REDIS_URL)


def forget() -> None:
    """Drop what this process knows of the replica (tests; after a change of configuration)."""
    _health.forget()


def _sticky_client():
    from exchange.runtime import redis_clients

    url = settings.REDIS_URL
    found = _redis.get(url)
    if found is None:
        with _redis_lock:
            found = _redis.get(url) or redis_clients.client(url, socket_timeout=0.5, socket_connect_timeout=0.5)
            _redis[url] = found
    return found


def mark_written(account_ids: Iterable[int]) -> None:
    """After a commit that changed these accounts: their history is read from the primary for the
    next REPLICA_STICKY_SECONDS. Nothing when no replica is configured."""
    if not configured():
        return
    ids = sorted(set(account_ids))
    if not ids:
        return
    ttl_ms = max(1, int(settings.REPLICA_STICKY_SECONDS * 1000))
    try:
        pipe = _sticky_client().pipeline(transaction=False)
        for account_id in ids:
            pipe.set(f"{STICKY_PREFIX}{account_id}", 1, px=ttl_ms)
        pipe.execute()
    except Exception as exc:  # noqa: BLE001 - any Redis failure: the readers then find no mark...
        # ...and a reader that cannot reach Redis reads the primary; one that can is within the
        # lag bound of this commit at worst (the guard), a window docs/scaling.md states.
        _sticky_outage.failed(exc)


def _recently_written(account_ids: Iterable[int]) -> bool:
    keys = [f"{STICKY_PREFIX}{account_id}" for account_id in sorted(set(account_ids))]
    if not keys:
        return False
    try:
        found = _sticky_client().exists(*keys)
    except Exception as exc:  # noqa: BLE001 - Redis away: the primary is always right
        _sticky_outage.failed(exc)
        return True
    _sticky_outage.ok()
    return bool(found)


def _replica_usable() -> bool:
    """The lag guard: the replica's lag, looked at most every REPLICA_CHECK_SECONDS per process."""
    if time.monotonic() < _health.until:
        return _health.usable
    # One thread looks; the others go by the last look meanwhile rather than queue behind a replica
    # that may take its connect timeout to answer.
    if not _health.lock.acquire(blocking=False):
        return _health.usable
    try:
        if time.monotonic() < _health.until:  # another thread looked meanwhile
            return _health.usable
        with connections[PRIMARY].cursor() as cursor:
            cursor.execute(_PRIMARY_LSN_SQL)
            primary_lsn = cursor.fetchone()[0]
        try:
            with connections[REPLICA].cursor() as cursor:
                cursor.execute(_LAG_SQL, [primary_lsn])
                lag = float(cursor.fetchone()[0])
        except DatabaseError as exc:
            _replica_failed(exc)
            return False
        _replica_outage.ok()
        _health.lag = lag
        _health.usable = lag < settings.REPLICA_MAX_LAG_SECONDS
        _health.until = time.monotonic() + settings.REPLICA_CHECK_SECONDS
        return _health.usable
    finally:
        _health.lock.release()


def _replica_failed(exc: BaseException) -> None:
    _replica_outage.failed(exc)
    _health.usable = False
    _health.until = time.monotonic() + settings.REPLICA_DOWN_SECONDS
    with contextlib.suppress(DatabaseError):  # a broken connection would fail the next look too
        connections[REPLICA].close()


def history_alias(account_ids: Iterable[int]) -> str:
    """The database a history read for these accounts may use now: REPLICA or PRIMARY."""
    if not configured() or connections[PRIMARY].in_atomic_block:
        return PRIMARY
    if _recently_written(account_ids):
        return PRIMARY
    return REPLICA if _replica_usable() else PRIMARY


def history_read(read: Callable[[str], T], *, account_ids: Iterable[int]) -> T:
    """`read(alias)` on the database history_alias chooses; a replica that fails it is skipped for a
    while and the read runs again on the primary."""
    alias = history_alias(account_ids)
    if alias == PRIMARY:
        return read(PRIMARY)
    try:
        return read(REPLICA)
    except DatabaseError as exc:
        _replica_failed(exc)
        return read(PRIMARY)
