"""The fast path: right after a posting commits, the committing process hands it to its publisher (a
daemon thread, `Publisher`), which sends its rows to the account's group (and to its master's, when
the master is whitelisted) in batches and then marks them published.

Only where the channel layer is shared (Redis) or in the server process itself: the embedded
in-memory layer exists in one process (its sends run on the server's event loop), so another process
(`manage.py deposit`) leaves its rows to the server's sweeper.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import queue
import threading
import time
from collections import defaultdict

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections

from accounts.ledger.posting import PostingResult
from exchange.api import formatting as fmt
from exchange.runtime.outage import Outage
from streams import fanout
from streams.events import row_payload
from streams.relay.feed import Messages, asset_precisions, mark_postings_published, messages_for

logger = logging.getLogger(__name__)
# While the channel layer or the database is away, every batch fails: logged once, then every 10 s.
PUBLISH_OUTAGE = Outage(logger, "Publishing postings failed; the sweeper will deliver them")
MARK_OUTAGE = Outage(logger, "Marking postings published failed; the sweeper will send them again")

_server_process = False
_server_loop: asyncio.AbstractEventLoop | None = None


def mark_server_process() -> None:
    """Called by the ASGI application: this process holds the websockets."""
    global _server_process
    _server_process = True


def remember_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The server's event loop, where the in-memory layer's sends must run (see ensure_relay)."""
    global _server_loop
    _server_loop = loop


def fast_path_enabled() -> bool:
    layer = get_channel_layer()
    return layer is not None and (_server_process or not isinstance(layer, InMemoryChannelLayer))


def _result_messages(results: list[PostingResult]) -> Messages:
    precision = asset_precisions(b.asset for r in results for b in r.balances)
    by_account: dict[int, list[dict]] = defaultdict(list)
    for result in results:
        created_ms = fmt.millis(result.created_at)
        for b in result.balances:
            by_account[b.account_id].append(
                row_payload(
                    seq=b.seq,
                    asset=b.asset,
                    precision=precision.get(b.asset, 8),
                    delta_free=b.delta_free,
                    delta_locked=b.delta_locked,
                    free=b.free,
                    locked=b.locked,
                    kind=result.kind,
                    posting_id=result.posting_id,
                    created_ms=created_ms,
                )
            )
    for rows in by_account.values():
        rows.sort(key=lambda row: row["seq"])
    return messages_for(by_account)


class Publisher:
    """This process's fast path: a daemon thread that publishes committed postings in batches.

    A posting is handed over in microseconds (`submit`: a queue put), so it never waits for Redis.
    The thread takes everything queued (lingering up to LINGER_SECONDS for more), builds one
    message per account, and sends them all with its sender (`streams.fanout`: for the Redis layer
    two round trips per batch, one when nobody listens). Rows are marked published only after they
    were sent, by one UPDATE for all the postings sent in the last MARK_DELAY_SECONDS, on the
    thread's own database connection. A crash before that mark costs duplicates (the sweeper sends
    the rows again; the hubs drop them); what a crash loses from the queue the sweeper publishes."""

    MAX_BATCH = 500
    LINGER_SECONDS = 0.002  # only when busy (see _take_batch)
    MARK_DELAY_SECONDS = 0.05  # well under STREAM_SWEEP_GRACE_SECONDS, so the sweeper rarely resends
    MAX_UNMARKED = 2000

    def __init__(self, sender, sender_key: tuple | None = None) -> None:
        self.sender = sender
        self.sender_key = sender_key
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Condition()
        self.pending = 0  # submitted, not yet marked published (or given up); guarded by _idle
        self.batches = 0
        self.marks = 0
        self._unmarked: list[int] = []
        self._unmarked_since = 0.0
        self._flush = False
        self._thread = threading.Thread(target=self._run, name="stream-publisher", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, result: PostingResult) -> None:
        with self._idle:
            self.pending += 1
        self._queue.put(result)

    def drain(self, timeout: float) -> bool:
        """Wait until everything submitted so far is sent and marked published (or given up);
        False on timeout."""
        with self._idle:
            if self.pending == 0:
                return True
            self._flush = True
        self._queue.put(None)  # wake the thread: mark now rather than after MARK_DELAY_SECONDS
        with self._idle:
            return self._idle.wait_for(lambda: self.pending == 0 or not self.alive(), timeout)

    def _take_batch(self) -> list[PostingResult]:
        """What is queued, waiting for the first item at most until the unmarked rows are due."""
        try:
            if self._unmarked:
                wait = self._unmarked_since + self.MARK_DELAY_SECONDS - time.monotonic()
                first = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            else:
                first = self._queue.get()
        except queue.Empty:
            return []
        batch = [first]
        while len(batch) < self.MAX_BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if len(batch) > 1:
            # Postings arrive faster than batches go out: wait a moment for more, so that the
            # batch's fixed costs (round trips, thread switches) are shared by more postings. A
            # lone posting goes out at once.
            deadline = time.monotonic() + self.LINGER_SECONDS
            while len(batch) < self.MAX_BATCH:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                try:
                    batch.append(self._queue.get(timeout=wait))
                except queue.Empty:
                    break
        return [result for result in batch if result is not None]

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch:
                self._publish(batch)
            if self._unmarked and (
                self._flush
                or len(self._unmarked) >= self.MAX_UNMARKED
                or time.monotonic() >= self._unmarked_since + self.MARK_DELAY_SECONDS
            ):
                self._mark()
            elif self._flush and not self._unmarked:
                self._flush = False

    def _done(self, count: int) -> None:
        with self._idle:
            self.pending -= count
            if self.pending == 0:
                self._idle.notify_all()

    def _publish(self, batch: list[PostingResult]) -> None:
        try:
            self.sender.send(_result_messages(batch))
        except Exception as exc:  # noqa: BLE001 - whatever failed, the sweeper delivers; the Outage logs it
            PUBLISH_OUTAGE.failed(exc)
            self._end_database_work()
            self._done(len(batch))
            return
        PUBLISH_OUTAGE.ok()
        self.batches += 1
        if not self._unmarked:
            self._unmarked_since = time.monotonic()
        self._unmarked.extend(result.posting_id for result in batch)

    def _mark(self) -> None:
        ids, self._unmarked = self._unmarked, []
        self._flush = False
        try:
            mark_postings_published(ids)
            self.marks += 1
        except Exception as exc:  # noqa: BLE001 - whatever failed, the sweeper delivers; the Outage logs it
            MARK_OUTAGE.failed(exc)
        finally:
            self._end_database_work()
            self._done(len(ids))

    @staticmethod
    def _end_database_work() -> None:
        """What Django does when a request ends (CONN_MAX_AGE, dropping a broken connection)."""
        with contextlib.suppress(Exception):
            close_old_connections()


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def _sender_key(layer) -> tuple | None:
    """What the sender depends on: the layer, and for the in-memory layer the server's loop."""
    if isinstance(layer, InMemoryChannelLayer):
        loop = _server_loop
        if loop is None or loop.is_closed():
            return None  # the embedded layer lives in the server's loop: its sweeper publishes these rows
        return (id(layer), loop)
    return (id(layer), None)


def _new_sender(layer):
    if isinstance(layer, InMemoryChannelLayer):
        return fanout.LayerSender(layer, _server_loop)
    if fanout.batch_send_supported(layer):
        return fanout.RedisGroupSender(layer)
    return fanout.LayerSender(layer)


def _process_publisher(layer) -> Publisher | None:
    global _publisher
    key = _sender_key(layer)
    if key is None:
        return None
    publisher = _publisher
    if publisher is not None and publisher.alive() and publisher.sender_key == key:
        return publisher
    with _publisher_lock:
        publisher = _publisher
        if publisher is not None and publisher.alive():
            if publisher.sender_key != key:
                publisher.sender = _new_sender(layer)
                publisher.sender_key = key
            return publisher
        publisher = Publisher(_new_sender(layer), key)
        if _publisher is None:
            # A short-lived process (`manage.py deposit`) publishes what it posted before it exits:
            # atexit functions run before the interpreter stops daemon threads such as the publisher.
            atexit.register(drain)
        _publisher = publisher
        return publisher


def drain(timeout: float = 2.0) -> bool:
    """Wait until this process's publisher has published everything handed to it so far."""
    publisher = _publisher
    return publisher is None or publisher.drain(timeout)


def publish_posting(result: PostingResult) -> None:
    """The fast path (a ledger after-commit listener): hand the posting to this process's publisher."""
    if not fast_path_enabled():
        return
    try:
        publisher = _process_publisher(get_channel_layer())
        if publisher is not None:
            publisher.submit(result)
    except Exception:
        logger.exception("Could not hand posting %s to the publisher; the sweeper will", result.posting_id)
