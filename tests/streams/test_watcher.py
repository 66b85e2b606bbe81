"""One watcher per server event loop checks every connection's listenKeys and every followed
account's sequence together: the work per interval does not grow with the number of connections'
round trips, a dead key still closes its connection (once), and an account whose catch-up is slow
does not hold up the others."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from streams import services, watcher
from streams.hub import ordering
from streams.relay import fast_path
from streams.store import store
from tests.support.factories import deposit
from tests.support.streams import communicator
from tests.support.waiting import DEADLINE_SECONDS, CallCounter, Sent, until

pytestmark = pytest.mark.django_db(transaction=True)

KEY_DEAD = {"type": "websocket.close", "code": 4001}


async def connect(key: str, sent: Sent | None = None):
    ws = communicator(key, sent=sent)
    connected, _ = await ws.connect()
    assert connected
    return ws


def current_watcher() -> watcher.KeyWatcher:
    return watcher._watchers[asyncio.get_running_loop()]


@pytest.mark.asyncio
async def test_one_look_up_per_interval_for_all_connections(make_user, monkeypatch):
    users = [await sync_to_async(make_user)() for _ in range(20)]
    calls = []
    look_up = watcher._look_up

    def counted(keys, accounts):
        calls.append((time.monotonic(), len(keys), len(accounts)))
        return look_up(keys, accounts)

    monkeypatch.setattr(watcher, "_look_up", counted)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2):
        clients = []
        for user in users:
            clients.append(await connect(await sync_to_async(services.listen_key_start)(account=user)))
        assert len(current_watcher().consumers) == 20
        await until(lambda: sum(1 for _, keys, _ in calls if keys == 20) >= 5, what="5 checks of all 20")
        full = [at for at, keys, accounts in calls if (keys, accounts) == (20, 20)]
        # One look-up per interval for all 20 connections (one per connection would be 20 per
        # interval): at most one per 0.2 s between the first and the last (a slow machine has fewer).
        assert len(full) <= (full[-1] - full[0]) / 0.2 + 2, (len(full), full[-1] - full[0])
        assert calls[-1][1:] == (20, 20)
        for ws in clients:
            assert ws.output_queue.empty()
            await ws.disconnect()
    assert not current_watcher().consumers
    assert current_watcher().task is None  # nobody left to watch


@pytest.mark.asyncio
async def test_expired_and_deleted_keys_among_many(make_user, monkeypatch):
    """Of three connections, the one whose key expires closes once; a further key of another one
    that expires is dropped from it; the third goes on."""
    alive, expiring, holder = [await sync_to_async(make_user)() for _ in range(3)]
    checks = CallCounter(watcher._look_up)
    monkeypatch.setattr(watcher, "_look_up", checks)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2):
        keep = await connect(await sync_to_async(services.listen_key_start)(account=alive))
        short = await sync_to_async(services.listen_key_start)(account=expiring)
        await sync_to_async(store().put)(short, expiring.pk, 1)
        expires_by = time.monotonic() + 1
        sent = Sent()
        dies = await connect(short, sent)
        carrier = await connect(await sync_to_async(services.listen_key_start)(account=holder))
        further = short  # a further key of the carrier: it expires with the other connection's
        await carrier.send_json_to({"method": "SUBSCRIBE", "params": [further], "id": 1})
        assert await carrier.receive_json_from(timeout=DEADLINE_SECONDS) == {"result": None, "id": 1}
        closed = await sent.first(KEY_DEAD)  # when the server sent it
        assert closed - expires_by <= 0.6, closed - expires_by  # at the checks right after the TTL
        assert await dies.receive_output(timeout=DEADLINE_SECONDS) == KEY_DEAD
        await checks.more(3)  # the watcher checked again meanwhile
        assert dies.output_queue.empty()  # one close frame only
        carrier_consumer = next(c for c in current_watcher().consumers if holder.pk in c.keys.values())
        assert further not in carrier_consumer.keys
        assert keep.output_queue.empty()
        assert carrier.output_queue.empty()
        for ws in (keep, dies, carrier):
            await ws.disconnect()


@pytest.mark.asyncio
async def test_a_stuck_catch_up_does_not_hold_up_the_others(make_user, assets, monkeypatch):
    """One account's catch-up hangs (the process's hub reads its rows from the change feed and that
    read never returns); another connection's key still expires on time, and the stuck account is
    not caught up again while its last catch-up runs. Once it returns, the client has the posting
    the channel layer never carried."""
    stuck_user, other_user = await sync_to_async(make_user)(), await sync_to_async(make_user)()
    gate = asyncio.Event()
    fills = []
    read_rows = ordering.read_rows

    async def hanging_read(account, first, upto):  # the hub's read of a gap or a catch-up
        fills.append(account)
        if account == stuck_user.pk:
            await gate.wait()
        return await read_rows(account, first, upto)

    monkeypatch.setattr(ordering, "read_rows", hanging_read)
    checks = CallCounter(watcher._look_up)
    monkeypatch.setattr(watcher, "_look_up", checks)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2):
        stuck = await connect(await sync_to_async(services.listen_key_start)(account=stuck_user))
        short = await sync_to_async(services.listen_key_start)(account=other_user)
        await sync_to_async(store().put)(short, other_user.pk, 1)
        other = await connect(short)
        await sync_to_async(deposit)(stuck_user, "1")
        await stuck.receive_json_from(timeout=3)  # balanceUpdate via the fast path
        await stuck.receive_json_from(timeout=3)  # outboundAccountPosition
        # A posting the channel layer never carries (its publisher is off): only the catch-up.
        monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
        await sync_to_async(deposit)(stuck_user, "2")
        assert await other.receive_output(timeout=3) == KEY_DEAD
        await checks.more(3)  # more checks: the stuck account is not caught up again meanwhile
        assert fills == [stuck_user.pk]
        assert stuck.output_queue.empty()
        gate.set()
        update = await stuck.receive_json_from(timeout=3)  # caught up from the change feed
        position = await stuck.receive_json_from(timeout=3)
        assert (update["e"], update["d"]) == ("balanceUpdate", "2.00000000")
        assert position["B"] == [{"a": "BTC", "f": "3.00000000", "l": "0.00000000"}]
        assert await stuck.receive_nothing(0.5)
        await stuck.disconnect()
        await other.disconnect()


def test_owners_of_many_keys_in_both_stores():
    from streams.store import MemoryStore

    for kind in (MemoryStore(), store()):
        kind.put("watcher-test-a", 7, 60)
        kind.put("watcher-test-b", 8, 60)
        kind.put("watcher-test-gone", 9, 60)
        kind.delete("watcher-test-gone")
        assert kind.owners(["watcher-test-a", "watcher-test-b", "watcher-test-gone", "watcher-test-never"]) == {
            "watcher-test-a": 7,
            "watcher-test-b": 8,
            "watcher-test-gone": None,
            "watcher-test-never": None,
        }
        assert kind.owners([]) == {}
        kind.delete("watcher-test-a")
        kind.delete("watcher-test-b")
