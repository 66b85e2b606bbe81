"""One watcher per server event loop for all its websocket connections: every STREAM_KEY_CHECK_SECONDS,
and at once (within STREAM_REVOCATION_CHECK_SECONDS, one GET of the store's deletion counter) when a
listenKey was deleted anywhere, it looks up every connection's listenKeys (one MGET; without Redis,
also in the database, as a connect does) and the current sequence of every account the process's hub
follows (one query), in one hop to a thread, then tells each connection whose key died (it closes,
or drops a further key) and the hub which accounts have changes committed beyond what it dispatched
(it catches each up from the change feed once for all the process's connections: the backstop for
messages the channel layer dropped). In the same hop, every third of a lease, it renews the leases
that count the process's connections in the per-listenKey and per-IP caps (one pipeline, store.py).
The deletion counter bounds a revocation whose close message the channel layer lost to about
STREAM_REVOCATION_CHECK_SECONDS (0.25) without checking every key that often. Without Redis the
store and the channel layer are this process's: another process's revocation moves the keyring's
read of the database's revocation log instead (accounts/keyring.py), followed the same way. At the
same pace it asks each connection how late it is (`check_lag`: 4006 beyond STREAM_MAX_LAG_SECONDS),
in memory and one ioctl per connection, so that a client that stopped reading is cut off between
frames too.

A watcher per connection did the same with two thread hops and two queries per connection: with
1,000 idle connections that was about 40% of a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Protocol

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.keyring import keyrings
from exchange.runtime.outage import Outage
from streams import clock, hub, relay
from streams.selectors import listen_key_owners
from streams.store import Lease, connection_lease_seconds, store


class Watched(Protocol):
    """What the watcher uses of a connection (streams/consumers.py's UserDataConsumer, which
    imports this module: the watcher names no consumer class)."""

    primary: str  # the listenKey in the connection's URL
    keys: Mapping[str, int]  # listenKey -> account
    lease: Lease | None

    async def key_dead(self, key: str) -> None: ...

    def check_lag(self) -> bool: ...


logger = logging.getLogger(__name__)
# While Redis or the database is away these fail at every check: logged once, then every 10 s.
CHECK_OUTAGE = Outage(logger, "Checking the streams' listenKeys failed; retrying")
LEASE_OUTAGE = Outage(logger, "Could not renew the connections' leases; retrying at the next check")

CHUNK = 1000  # keys per MGET, accounts per query


def _look_up(keys: list[str], accounts: list[int]) -> tuple[dict[str, int | None], dict[int, int]]:
    # Without Redis the store is this process's memory, where another process's revocation never
    # lands: the keys are also checked in the database (closed record, disabled holder, frozen or
    # inactive account; two queries), as a connect is.
    owners_of = store().owners if settings.REDIS_URL else listen_key_owners
    owners: dict[str, int | None] = {}
    for start in range(0, len(keys), CHUNK):
        owners.update(owners_of(keys[start : start + CHUNK]))
    seqs: dict[int, int] = {}
    for start in range(0, len(accounts), CHUNK):
        seqs.update(relay.current_seqs(accounts[start : start + CHUNK]))
    return owners, seqs


def _deletions() -> object | None:
    """What moves when a listenKey may have died elsewhere: the store's deletion counter and,
    without Redis (the embedded mode, whose store is this process's memory), where the keyring's
    last read of the database's revocation log ended: a `manage.py` command that disables a key,
    freezes an account or closes a listenKey reaches the server only through that log."""
    clock.hub.sync_if_due()  # the hubs' estimate of Redis's clock, every clock.REFRESH_SECONDS
    try:
        seen = store().deletions()
        return seen if settings.REDIS_URL else (seen, keyrings.revocations())
    except Exception:  # the check itself reports a store that cannot be reached
        logger.debug("Could not read the listenKey deletion counter", exc_info=True)
        return None


def _renew_and_look_up(
    leases: list[Lease] | None, keys: list[str], accounts: list[int]
) -> tuple[dict[str, int | None], dict[int, int]]:
    if leases is not None:
        try:
            store().connections_renew(leases, seconds=connection_lease_seconds())
        except Exception as exc:  # noqa: BLE001 - logged by the Outage; renewed at the next check
            LEASE_OUTAGE.failed(exc)
        else:
            LEASE_OUTAGE.ok()
    return _look_up(keys, accounts)


class KeyWatcher:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.consumers: set[Watched] = set()
        self.visits: dict[Watched, asyncio.Task] = {}
        self.task: asyncio.Task | None = None
        self.renewed_at = time.monotonic()  # new connections' leases are fresh

    def add(self, consumer: Watched) -> None:
        self.consumers.add(consumer)
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run())

    def discard(self, consumer: Watched) -> None:
        self.consumers.discard(consumer)
        visit = self.visits.pop(consumer, None)
        if visit is not None and visit is not asyncio.current_task():
            visit.cancel()
        if not self.consumers and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        checked_at = time.monotonic()
        deletions = None
        while True:
            await asyncio.sleep(min(settings.STREAM_REVOCATION_CHECK_SECONDS, settings.STREAM_KEY_CHECK_SECONDS))
            try:
                # A key deleted anywhere (revoked, closed): check now rather than at the next round,
                # so a lost close message delays a revocation by this short interval only.
                # One Redis GET: off the thread the connections' database work queues on.
                self.check_lags()
                seen = await sync_to_async(_deletions, thread_sensitive=False)()
                moved = None not in (seen, deletions) and seen != deletions
                deletions = seen
                if moved or time.monotonic() - checked_at >= settings.STREAM_KEY_CHECK_SECONDS:
                    checked_at = time.monotonic()
                    await self.check()
                    CHECK_OUTAGE.ok()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if hub.cancelling():  # a library turned our cancellation into another error
                    raise
                CHECK_OUTAGE.failed(exc)

    def check_lags(self) -> None:
        """Between two of its frames too, a connection more than STREAM_MAX_LAG_SECONDS behind is
        closed (4006): a client that stopped reading is found within this interval."""
        for consumer in list(self.consumers):
            try:
                consumer.check_lag()
            except Exception:
                logger.exception("A stream's lag check failed")

    async def check(self) -> None:
        consumers = list(self.consumers)
        keys = sorted({key for consumer in consumers for key in consumer.keys})
        hubs = hub.hubs()
        accounts = sorted({account for each in hubs for account in each.followed()})
        if not keys and not accounts:
            return
        leases = None
        if time.monotonic() - self.renewed_at >= connection_lease_seconds() / 3:
            leases = [consumer.lease for consumer in consumers if consumer.lease is not None]
            self.renewed_at = time.monotonic()
        owners, seqs = await database_sync_to_async(_renew_and_look_up)(leases, keys, accounts)
        for each in hubs:
            each.catch_up(seqs)
            each.maintain()
        for consumer in consumers:
            running = self.visits.get(consumer)
            if consumer not in self.consumers or (running is not None and not running.done()):
                continue  # gone meanwhile, or still busy with the last visit (a slow consumer)
            dead = [key for key in consumer.keys if key in owners and owners[key] is None]
            if dead:
                self.visits[consumer] = self.loop.create_task(self._visit(consumer, dead))

    async def _visit(self, consumer: Watched, dead: list[str]) -> None:
        try:
            if consumer.primary in dead:
                await consumer.key_dead(consumer.primary)
                return
            for key in dead:
                await consumer.key_dead(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("A stream's listenKey check failed")


_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeyWatcher] = weakref.WeakKeyDictionary()


def watch(consumer: Watched) -> None:
    """In the server's event loop: check this connection's keys with all the others."""
    loop = asyncio.get_running_loop()
    watcher = _watchers.get(loop)
    if watcher is None:
        watcher = _watchers[loop] = KeyWatcher(loop)
    watcher.add(consumer)


def unwatch(consumer: Watched) -> None:
    with contextlib.suppress(RuntimeError):  # no running loop: nothing was watched from here
        watcher = _watchers.get(asyncio.get_running_loop())
        if watcher is not None:
            watcher.discard(consumer)
