"""The relay's at-least-once path: rows the committing process never published (its fast path
failed, or it was killed between commit and publish) reach the client through the sweeper; a
consumer fills gaps from the database and never sends a row twice."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import signal
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels_redis.core import BoundedQueue
from django.conf import settings
from django.db import connection
from django.test import override_settings

from accounts import ledger
from accounts.ledger.models import BalanceChange
from accounts.models import SystemRole
from streams import relay
from streams.hub import hub_for
from streams.relay import fast_path, sweeper
from tests.support.factories import deposit
from tests.support.streams import connect, deposit_from_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

WORKER = Path(__file__).with_name("crash_worker.py")
SWEEPER = {"STREAM_SWEEPER_ENABLED": True, "STREAM_SWEEP_SECONDS": 0.1, "STREAM_SWEEP_GRACE_SECONDS": 0}


@pytest.fixture
def sweeper_slot(monkeypatch):
    """No sweeper from an earlier test's (closed) event loop; this test's is cancelled at the end."""
    monkeypatch.setattr(sweeper, "_sweeper", None)
    yield
    task = sweeper._sweeper
    if task is not None and not task.done():
        with contextlib.suppress(RuntimeError):  # its event loop may be closed already
            task.cancel()


async def stop_sweeper() -> None:
    task = sweeper._sweeper
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    sweeper._sweeper = None


def published(posting_id: int, account_id: int):
    return BalanceChange.objects.get(posting_id=posting_id, account_id=account_id).published_at


async def wait_published(posting_id: int, account_id: int, timeout: float = 3.0):
    deadline = time.monotonic() + timeout
    while True:
        moment = await sync_to_async(published)(posting_id, account_id)
        if moment is not None or time.monotonic() > deadline:
            return moment
        await asyncio.sleep(0.05)


async def expect_deposit(ws, amount: str, free: str) -> tuple[dict, dict]:
    update = await ws.receive_json_from(timeout=5)
    position = await ws.receive_json_from(timeout=5)
    assert set(update) == {"e", "E", "a", "d", "T", "BS"}
    assert (update["e"], update["a"], update["d"], update["BS"]) == ("balanceUpdate", "BTC", amount, "CHAIN_DEPOSIT")
    assert set(position) == {"e", "E", "u", "B"}
    assert position["e"] == "outboundAccountPosition"
    assert position["B"] == [{"a": "BTC", "f": free, "l": "0.00000000"}]
    return update, position


# --- in-process: the fast path does not publish -------------------------------------------------


async def test_sweeper_delivers_what_the_fast_path_left(master, assets, monkeypatch, sweeper_slot):
    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
    ws = await connect(master)  # the sweeper is off in test settings: connect starts none
    assert sweeper._sweeper is None
    result = await sync_to_async(deposit)(master, "1.5")
    assert await ws.receive_nothing(0.5)
    assert await sync_to_async(published)(result.posting_id, master.pk) is None
    try:
        with override_settings(**SWEEPER):
            relay.ensure_relay()
            assert sweeper._sweeper is not None
            await expect_deposit(ws, "1.50000000", "1.50000000")
            assert await wait_published(result.posting_id, master.pk) is not None
            # Later rows too, in order, each once.
            for n in range(2, 6):
                await sync_to_async(deposit)(master, str(n))
            total = Decimal("1.5")
            for n in range(2, 6):
                total += n
                await expect_deposit(ws, f"{Decimal(n):.8f}", f"{total:.8f}")
            assert await ws.receive_nothing(0.5)
    finally:
        await stop_sweeper()
    await ws.disconnect()


async def test_sweeper_delivers_after_a_failed_fast_path_send(master, assets, monkeypatch, sweeper_slot):
    """The fast path raises while sending (channel layer down): the rows stay unpublished, the
    posting itself stands, and the sweeper delivers them."""

    def broken(*args, **kwargs):
        raise ConnectionError("channel layer unavailable")

    monkeypatch.setattr(fast_path, "_result_messages", broken)  # the fast path's send step
    ws = await connect(master)
    result = await sync_to_async(deposit)(master, "0.75")
    assert await ws.receive_nothing(0.5)
    assert await sync_to_async(published)(result.posting_id, master.pk) is None
    try:
        with override_settings(**SWEEPER):
            relay.ensure_relay()
            await expect_deposit(ws, "0.75000000", "0.75000000")
            assert await wait_published(result.posting_id, master.pk) is not None
    finally:
        await stop_sweeper()
    await ws.disconnect()


# --- a real process killed between commit and publish ---------------------------------------------


def worker_env() -> dict[str, str]:
    db = connection.settings_dict
    url = (
        f"postgres://{quote(db['USER'], safe='')}:{quote(db['PASSWORD'] or '', safe='')}"
        f"@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="exchange.settings.test",
        DATABASE_URL=url,
        REDIS_URL=settings.REDIS_URL,
        PYTHONUNBUFFERED="1",
    )
    return env


async def run_worker(user, amount: str, reference: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.streams.crash_worker",  # from the project root (cwd): the project's packages import
        str(user.pk),
        amount,
        reference,
        env=worker_env(),
        cwd=str(WORKER.parents[2]),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode, out.decode(), err.decode()


async def test_killed_process_event_is_delivered_by_the_sweeper(master, assets, sweeper_slot):
    await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)  # created here, not racing the worker
    ws = await connect(master)
    code, out, err = await run_worker(master, "2.5", "crash:1")
    assert code == -signal.SIGKILL, (code, out, err)
    posting_id = int(out.split()[-1])
    # Committed, never published: the process died first.
    change = await BalanceChange.objects.aget(posting_id=posting_id, account_id=master.pk)
    assert change.published_at is None
    assert change.free_after == Decimal("2.5")
    assert await ws.receive_nothing(0.3)
    try:
        with override_settings(**SWEEPER):
            relay.ensure_relay()
            update, position = await expect_deposit(ws, "2.50000000", "2.50000000")
            assert update["T"] == position["u"]
            assert await wait_published(posting_id, master.pk) is not None
            assert await ws.receive_nothing(0.3)
    finally:
        await stop_sweeper()
    await ws.disconnect()


async def test_killed_process_event_arrives_with_the_sweeper_running(master, assets, sweeper_slot):
    """As in a server: the sweeper runs all along (default grace), a worker process dies after its
    commit; the connected client gets the event within about a second."""
    await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    try:
        with override_settings(STREAM_SWEEPER_ENABLED=True, STREAM_SWEEP_SECONDS=0.1):
            ws = await connect(master)  # starts this process's sweeper
            assert sweeper._sweeper is not None
            assert not sweeper._sweeper.done()
            await sync_to_async(deposit)(master, "1")  # the fast path still works here
            await expect_deposit(ws, "1.00000000", "1.00000000")
            code, out, err = await run_worker(master, "0.5", "crash:2")
            died = time.monotonic()
            assert code == -signal.SIGKILL, (code, out, err)
            await expect_deposit(ws, "0.50000000", "1.50000000")
            assert time.monotonic() - died < 1.5
            assert await wait_published(int(out.split()[-1]), master.pk) is not None
            assert await ws.receive_nothing(0.5)
    finally:
        await stop_sweeper()
    await ws.disconnect()


# --- gap fill and duplicates ------------------------------------------------------------------------


async def test_gap_is_filled_in_order_and_duplicates_are_dropped(master, assets, monkeypatch, sweeper_slot):
    ws = await connect(master)
    first = await sync_to_async(deposit)(master, "1")  # seq N, delivered
    await expect_deposit(ws, "1.00000000", "1.00000000")
    seq_n = first.balances[0].seq

    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
    missing = await sync_to_async(deposit)(master, "2")  # seq N+1, never published
    later = await sync_to_async(deposit)(master, "4")  # seq N+2, delivered by hand below
    assert missing.balances[0].seq == seq_n + 1
    assert later.balances[0].seq == seq_n + 2
    assert await ws.receive_nothing(0.3)

    layer = get_channel_layer()
    rows = await sync_to_async(relay.rows_between)(master.pk, seq_n + 2, seq_n + 2)
    assert [row["seq"] for row in rows] == [seq_n + 2]
    message = {"type": "ledger.changes", "account": master.pk, "email": master.email, "rows": rows}
    await layer.group_send(relay.account_group(master.pk), message)
    await expect_deposit(ws, "2.00000000", "3.00000000")  # N+1, from the database
    await expect_deposit(ws, "4.00000000", "7.00000000")  # N+2
    assert await ws.receive_nothing(0.3)

    # The same message again, and one carrying both rows: nothing new, nothing twice.
    await layer.group_send(relay.account_group(master.pk), message)
    both = await sync_to_async(relay.rows_between)(master.pk, seq_n + 1, seq_n + 2)
    await layer.group_send(relay.account_group(master.pk), {**message, "rows": both})
    assert await ws.receive_nothing(0.5)

    # The sweeper later publishes the rows nobody marked: they are duplicates and are dropped.
    try:
        with override_settings(**SWEEPER):
            relay.ensure_relay()
            assert await wait_published(missing.posting_id, master.pk) is not None
            assert await wait_published(later.posting_id, master.pk) is not None
            assert await ws.receive_nothing(0.5)
    finally:
        await stop_sweeper()

    # And the stream goes on after the gap.
    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: True)
    await sync_to_async(deposit)(master, "8")
    await expect_deposit(ws, "8.00000000", "15.00000000")
    await ws.disconnect()


async def test_rows_from_before_the_connection_are_not_replayed(master, assets, sweeper_slot):
    """Rows left unpublished from before a client connected are history: when the sweeper
    publishes them the new connection does not show them."""
    old = await sync_to_async(_deposit_unpublished)(master, "3")
    ws = await connect(master)
    try:
        with override_settings(**SWEEPER):
            relay.ensure_relay()
            assert await wait_published(old.posting_id, master.pk) is not None
            assert await ws.receive_nothing(0.5)
    finally:
        await stop_sweeper()
    await sync_to_async(deposit)(master, "1")
    await expect_deposit(ws, "1.00000000", "4.00000000")
    await ws.disconnect()


def _deposit_unpublished(user, amount: str):
    original = fast_path.fast_path_enabled
    fast_path.fast_path_enabled = lambda: False
    try:
        return deposit(user, amount)
    finally:
        fast_path.fast_path_enabled = original


# --- a burst while the hub is stalled ---------------------------------------------------------


async def test_burst_beyond_channel_capacity_while_the_hub_is_stalled(master, assets, monkeypatch):
    """The process's hub is slow for a moment (here: its receive waits on a gate) while 120 postings
    of its account commit: more messages than the channel layer holds for it (its capacity, 20 here)
    pile up, and the layer drops some (Redis refuses them beyond the capacity; the process's receive
    buffer keeps only the newest). The fast path has marked them published, so the sweeper will not
    send them again. Every one of them must still reach the client once the hub goes on."""
    count, threads = 120, 4
    layer = get_channel_layer()
    gate = asyncio.Event()
    gate.set()
    stalled: list[str] = []  # the hub's channel, once stalled
    receive = layer.receive

    async def gated_receive(channel):
        if channel in stalled:
            await gate.wait()
        return await receive(channel)

    monkeypatch.setattr(layer, "receive", gated_receive)
    monkeypatch.setattr(layer, "capacity", 20)
    monkeypatch.setattr(layer, "receive_buffer", collections.defaultdict(functools.partial(BoundedQueue, 20)))
    world = await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2):
        ws = await connect(master)
        hub = hub_for(layer)
        publisher = fast_path._process_publisher(layer)
        messages_before, batches_before = hub.messages, publisher.batches
        gate.clear()
        stalled.append(hub.channel.name)

        await deposit_from_threads(world, lambda n: master, count, threads, "burst")
        # The fast path has sent every row (and marked it published) while the hub waits.
        deadline = time.monotonic() + 10
        while await BalanceChange.objects.filter(account_id=master.pk, published_at__isnull=True).aexists():
            assert time.monotonic() < deadline, "the fast path did not publish the burst"
            await asyncio.sleep(0.05)
        sent = publisher.batches - batches_before  # one message a batch: one account
        gate.set()

        positions = []
        deadline = time.monotonic() + 10
        while len(positions) < count and time.monotonic() < deadline:
            if ws.output_queue.empty():
                await asyncio.sleep(0.05)
                continue
            event = await ws.receive_json_from(timeout=1)
            if event["e"] == "outboundAccountPosition":
                positions.append(Decimal(event["B"][0]["f"]))
        assert len(positions) == count
        assert positions == sorted(positions)
        assert positions[-1] == Decimal(count * (count + 1) // 2) / 10**8
        assert hub.messages - messages_before < sent  # some were dropped on the way ...
        assert hub.ordering.fills >= 1  # ... and read from the change feed instead
        await ws.disconnect()
