"""The relay: change-feed rows to the websocket consumers, at least once and in order.

- Fast path: right after a posting commits, the committing process hands it to its publisher (an
  event loop: the server's, or a daemon thread's in processes without websockets), which sends the
  rows to the account's group (and to its master's, when the master is whitelisted) in batches and
  marks them published. Only where the channel layer is shared (Redis) or in the server process
  itself: the embedded in-memory layer exists in one process, so another process
  (`manage.py deposit`) leaves its rows to the server.
- Sweeper: an asyncio task in each server process publishes rows still unpublished after
  STREAM_SWEEP_GRACE_SECONDS (a process that crashed between commit and publish, or another
  process in the embedded default).
- Order: every row carries its per-account sequence; a consumer drops what it has already sent and
  fills any gap from the database before going on, so duplicates and reordering between the two
  paths never reach a client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from datetime import timedelta

from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from accounts.ledger.models import Asset, BalanceChange
from accounts.ledger.posting import PostingResult
from accounts.models import LedgerAccount, User
from exchange.api import formatting as fmt
from streams.events import row_payload

logger = logging.getLogger(__name__)
_server_process = False


def account_group(account_id: int) -> str:
    return f"streams.acct.{account_id}"


def mark_server_process() -> None:
    """Called by the ASGI application: this process holds the websockets."""
    global _server_process
    _server_process = True


def fast_path_enabled() -> bool:
    layer = get_channel_layer()
    return layer is not None and (_server_process or not isinstance(layer, InMemoryChannelLayer))


_precision_cache: dict[str, int] = {}
_audience_cache: dict[int, tuple[float, str, list[int]]] = {}
AUDIENCE_TTL_SECONDS = 5.0


def _precisions(codes) -> dict[str, int]:
    codes = set(codes)
    missing = codes - _precision_cache.keys()
    if missing:
        _precision_cache.update(Asset.objects.filter(code__in=missing).values_list("code", "transfer_precision"))
    return {code: _precision_cache.get(code, 8) for code in codes}


def _audiences(account_ids) -> dict[int, tuple[str, list[int]]]:
    """Per account: its e-mail and the groups its events go to (its own; its master's when the
    master is whitelisted). Cached a few seconds: an operator's change of the whitelisted flag
    reaches the stream within AUDIENCE_TTL_SECONDS."""
    now = time.monotonic()
    wanted = set(account_ids)
    stale = {a for a in wanted if a not in _audience_cache or _audience_cache[a][0] < now}
    if stale:
        rows = User.objects.filter(pk__in=stale).values_list(
            "pk", "email", "master_id", "master__is_whitelisted_master"
        )
        for pk, email, master, whitelisted in rows:
            _audience_cache[pk] = (
                now + AUDIENCE_TTL_SECONDS,
                email,
                [pk] + ([master] if master and whitelisted else []),
            )
    return {a: (_audience_cache[a][1], _audience_cache[a][2]) for a in wanted if a in _audience_cache}


def messages_for(rows_by_account: dict[int, list[dict]]) -> list[tuple[str, dict]]:
    audiences = _audiences(rows_by_account)
    messages = []
    for account, rows in rows_by_account.items():
        email, groups = audiences.get(account, ("", [account]))
        message = {"type": "ledger.changes", "account": account, "email": email, "rows": rows}
        messages.extend((account_group(group), message) for group in groups)
    return messages


def _result_messages(results: list[PostingResult]) -> list[tuple[str, dict]]:
    precision = _precisions(b.asset for r in results for b in r.balances)
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


def _mark_postings_published(posting_ids: list[int]) -> None:
    BalanceChange.objects.filter(posting_id__in=posting_ids, published_at__isnull=True).update(
        published_at=timezone.now()
    )


class Publisher:
    """Publishes committed postings from one event loop, in batches. Postings are handed over from
    any thread in microseconds (`submit`), so a posting never waits for Redis; what a crash loses
    from the queue the sweeper publishes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.pending = 0  # submitted, not yet published (or given up)

    def alive(self) -> bool:
        return self.loop.is_running() and not self.loop.is_closed()

    def submit(self, result: PostingResult) -> None:
        self.pending += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, result)

    async def run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while not self.queue.empty() and len(batch) < 500:
                batch.append(self.queue.get_nowait())
            try:
                messages = await database_sync_to_async(_result_messages)(batch)
                layer = get_channel_layer()
                for group, message in messages:
                    await layer.group_send(group, message)
                await database_sync_to_async(_mark_postings_published)([r.posting_id for r in batch])
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Publishing %s postings failed; the sweeper will deliver them", len(batch))
            finally:
                self.pending -= len(batch)


_server_publisher: Publisher | None = None
_thread_publisher: Publisher | None = None
_thread_lock = threading.Lock()


def _start_thread_publisher() -> Publisher:
    """A daemon thread with its own event loop (processes without websockets: gunicorn, Celery)."""
    global _thread_publisher
    with _thread_lock:
        if _thread_publisher is not None and _thread_publisher.alive():
            return _thread_publisher
        ready = threading.Event()
        holder: dict = {}

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            publisher = Publisher(loop)
            holder["publisher"] = publisher
            loop.call_soon(ready.set)
            loop.run_until_complete(publisher.run())

        threading.Thread(target=main, name="stream-publisher", daemon=True).start()
        # A short-lived process (`manage.py deposit`) publishes what it posted before it exits; this
        # runs before concurrent.futures stops the executors database_sync_to_async needs.
        threading._register_atexit(_drain_thread_publisher)
        ready.wait(5)
        _thread_publisher = holder["publisher"]
        return _thread_publisher


def _drain_thread_publisher(timeout: float = 2.0) -> None:
    publisher = _thread_publisher
    deadline = time.monotonic() + timeout
    while publisher is not None and publisher.pending > 0 and publisher.alive() and time.monotonic() < deadline:
        time.sleep(0.005)


def publish_posting(result: PostingResult) -> None:
    """The fast path (a ledger after-commit listener): hand the posting to this process's publisher."""
    if not fast_path_enabled():
        return
    server = _server_publisher
    if server is not None and server.alive():
        server.submit(result)
        return
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return  # the embedded layer lives in the server process: its sweeper publishes these rows
    try:
        _start_thread_publisher().submit(result)
    except Exception:
        logger.exception("Could not hand posting %s to the publisher; the sweeper will", result.posting_id)


# --- reading the change feed -------------------------------------------------------------------


def _payload(change: BalanceChange, precision: dict[str, int]) -> dict:
    return row_payload(
        seq=change.seq,
        asset=change.asset.code,
        precision=precision.get(change.asset.code, 8),
        delta_free=change.delta_free,
        delta_locked=change.delta_locked,
        free=change.free_after,
        locked=change.locked_after,
        kind=change.kind,
        posting_id=change.posting_id,
        created_ms=fmt.millis(change.created_at),
    )


def rows_between(account_id: int, first_seq: int, last_seq: int) -> list[dict]:
    """Gap fill for a consumer: the account's rows with first_seq <= seq <= last_seq."""
    changes = list(
        BalanceChange.objects.select_related("asset")
        .filter(account_id=account_id, seq__gte=first_seq, seq__lte=last_seq)
        .order_by("seq")
    )
    precision = _precisions(c.asset.code for c in changes)
    return [_payload(c, precision) for c in changes]


def current_seqs(account_ids) -> dict[int, int]:
    return dict(LedgerAccount.objects.filter(user_id__in=set(account_ids)).values_list("user_id", "seq"))


def unpublished(grace_seconds: float, limit: int = 2000) -> tuple[list[int], list[tuple[str, dict]]]:
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    changes = list(
        BalanceChange.objects.select_related("asset")
        .filter(published_at__isnull=True, created_at__lte=cutoff)
        .order_by("id")[:limit]
    )
    if not changes:
        return [], []
    precision = _precisions(c.asset.code for c in changes)
    by_account: dict[int, list[dict]] = defaultdict(list)
    for change in sorted(changes, key=lambda c: (c.account_id, c.seq)):
        by_account[change.account_id].append(_payload(change, precision))
    return [c.pk for c in changes], messages_for(by_account)


def mark_published(ids: list[int]) -> None:
    BalanceChange.objects.filter(pk__in=ids, published_at__isnull=True).update(published_at=timezone.now())


# --- the sweeper ---------------------------------------------------------------------------------

_sweeper: asyncio.Task | None = None


async def sweep_once(grace_seconds: float | None = None) -> int:
    grace = settings.STREAM_SWEEP_GRACE_SECONDS if grace_seconds is None else grace_seconds
    ids, messages = await database_sync_to_async(unpublished)(grace)
    layer = get_channel_layer()
    for group, message in messages:
        await layer.group_send(group, message)
    if ids:
        await database_sync_to_async(mark_published)(ids)
    return len(ids)


async def _sweep_forever() -> None:
    while True:
        try:
            await sweep_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Relay sweep failed; retrying")
            await database_sync_to_async(close_old_connections)()
        await asyncio.sleep(settings.STREAM_SWEEP_SECONDS)


_publisher_task: asyncio.Task | None = None


def ensure_relay() -> None:
    """In the server's event loop (called when a websocket connects): start this process's
    publisher and, unless disabled, its sweeper (once per loop)."""
    global _sweeper, _server_publisher, _publisher_task
    loop = asyncio.get_running_loop()
    if _server_publisher is None or _server_publisher.loop is not loop or _publisher_task.done():
        _server_publisher = Publisher(loop)
        _publisher_task = loop.create_task(_server_publisher.run())
    if settings.STREAM_SWEEPER_ENABLED and (_sweeper is None or _sweeper.done() or _sweeper.get_loop() is not loop):
        _sweeper = loop.create_task(_sweep_forever())
