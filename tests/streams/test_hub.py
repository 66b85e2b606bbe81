"""The process's fan-out hub (streams/hub/) on the real PostgreSQL and Redis: one busy account whose
postings two publishers send (as two REST processes do), many connections on one listenKey, a real
gap, a connection too slow to take its frames, and connections that join, subscribe and listen
twice while the account is busy."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import BalanceChange
from accounts.models import SystemRole, User
from streams import consumers, relay, services, watcher
from streams.consumers import UserDataConsumer
from streams.hub import Listener, Read, frames, hub_for, ordering
from streams.relay import Publisher, fast_path
from streams.services import key_group
from streams.store import store
from tests.support.factories import deposit
from tests.support.streams import communicator
from tests.support.waiting import until, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

KEY_DEAD = {"type": "websocket.close", "code": 4001}
TOO_SLOW = {"type": "websocket.close", "code": 4006}


async def key_of(user) -> str:
    return await sync_to_async(services.listen_key_start)(account=user)


async def open_ws(key: str):
    ws = communicator(key)
    connected, code = await ws.connect()
    assert connected, code
    return ws


async def request(ws, method: str, params: list[str], request_id: int) -> dict:
    await ws.send_json_to({"method": method, "params": params, "id": request_id})
    return await ws.receive_json_from(timeout=5)


async def positions(ws, count: int, *, email: str | None = None, timeout: float = 10) -> list[Decimal]:
    """The free BTC balance of the next `count` outboundAccountPositions (the balanceUpdates before
    them checked for the same view)."""
    frees: list[Decimal] = []
    while len(frees) < count:
        event = await ws.receive_json_from(timeout=timeout)
        assert event.get("em") == email, event
        if event["e"] == "outboundAccountPosition":
            frees.append(Decimal(event["B"][0]["f"]))
    return frees


def committed(account_id: int, prefix: str) -> list[tuple[int, Decimal]]:
    """(sequence, free after) of the account's postings whose reference starts with `prefix`."""
    changes = BalanceChange.objects.filter(account_id=account_id, posting__reference__startswith=prefix)
    return list(changes.order_by("seq").values_list("seq", "free_after"))


def counting_reads(monkeypatch) -> list[tuple[int, int, int]]:
    """Every change-feed read of rows (a gap filled, an account caught up, a connection replayed)."""
    reads: list[tuple[int, int, int]] = []
    rows_between = relay.rows_between

    def counted(account_id, first_seq, last_seq):
        reads.append((account_id, first_seq, last_seq))
        return rows_between(account_id, first_seq, last_seq)

    monkeypatch.setattr(relay, "rows_between", counted)
    return reads


def current_consumers() -> set[UserDataConsumer]:
    return set(watcher._watchers[asyncio.get_running_loop()].consumers)


class TwoPublishers:
    """Postings committed by two threads, each handing them to a publisher of its own (as two REST
    processes do, each with its own publisher thread). The second publisher sends `delay` late (a
    busier process), so that the account's sequences reach the server out of order."""

    def __init__(self, monkeypatch, delay: float) -> None:
        layer = get_channel_layer()
        self.publishers = [Publisher(fast_path._new_sender(layer)) for _ in range(2)]
        late = self.publishers[1].sender
        send = late.send

        def send_late(messages) -> None:
            time.sleep(delay)
            send(messages)

        late.send = send_late
        self.local = threading.local()
        monkeypatch.setattr(fast_path, "_process_publisher", lambda layer: getattr(self.local, "publisher", None))

    def post(self, account_id: int, count: int, prefix: str, pause: float = 0.0):
        """Deposits of n satoshi, n = 1..count, alternately from the two threads; an awaitable."""

        def share(index: int) -> None:
            self.local.publisher = self.publishers[index]
            try:
                world = ledger.system_account_id(SystemRole.WORLD)
                for n in range(index + 1, count + 1, 2):
                    ledger.post(
                        legs=ledger.move(world, account_id, "BTC", Decimal(n) / 10**8),
                        kind="CHAIN_DEPOSIT",
                        reference=f"{prefix}:{n}",
                    )
                    if pause:
                        time.sleep(pause)
            finally:
                self.local.publisher = None
                connection.close()

        return asyncio.gather(*(sync_to_async(share, thread_sensitive=False)(index) for index in range(2)))


# --- several publishers, one busy account ----------------------------------------------------------


async def test_two_publishers_every_connection_gets_every_sequence_once_in_order_without_reads(
    master, assets, monkeypatch
):
    """200 postings of one account committed by two threads with a publisher each, the second
    30 ms late: sequences arrive interleaved and out of order. Each of three connections gets every
    posting once, in sequence order, and nothing is read from the database: the rows that arrive
    ahead wait for the other publisher's (the server read the database at every out-of-order
    arrival, per connection, on Daphne's one database thread: seconds of lag under load)."""
    reads = counting_reads(monkeypatch)
    await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    count = 200
    key = await key_of(master)
    with override_settings(STREAM_GAP_WAIT_SECONDS=1.0):  # well beyond the late publisher's delay
        clients = [await open_ws(key) for _ in range(3)]
        poster = TwoPublishers(monkeypatch, delay=0.03)
        posting = poster.post(master.pk, count, "two")
        try:
            received = [await positions(ws, count) for ws in clients]
        finally:
            await posting
        expected = [free for _, free in await sync_to_async(committed)(master.pk, "two:")]
        assert len(expected) == count
        for frees in received:
            assert frees == expected
        await poster.post(master.pk, 1, "mark")  # the next one: a posting twice would come before it
        for ws in clients:
            assert await positions(ws, 1) == [expected[-1] + Decimal("0.00000001")]
        assert reads == []
        assert hub_for(get_channel_layer()).ordering.waits > 0  # they did arrive out of order
        for ws in clients:
            await ws.disconnect()


async def test_a_message_that_never_comes_is_read_after_the_wait_once_for_all_connections(master, assets, monkeypatch):
    """A row lost on the way (its process crashed before publishing, or Redis dropped it) while the
    next one arrives: after STREAM_GAP_WAIT_SECONDS the hub reads it, once for the account however
    many connections listen, and every connection gets both in order."""
    rows_between = relay.rows_between
    reads = counting_reads(monkeypatch)
    key = await key_of(master)
    with override_settings(STREAM_GAP_WAIT_SECONDS=0.3):
        clients = [await open_ws(key), await open_ws(key)]
        await sync_to_async(deposit)(master, "1")
        for ws in clients:
            assert await positions(ws, 1) == [Decimal(1)]
        monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
        lost = await sync_to_async(deposit)(master, "2")  # never published
        later = await sync_to_async(deposit)(master, "4")
        seq = later.balances[0].seq
        rows = await sync_to_async(rows_between)(master.pk, seq, seq)
        sent_at = time.monotonic()
        message = {"type": "ledger.changes", "account": master.pk, "email": master.email, "rows": rows}
        await get_channel_layer().group_send(relay.account_group(master.pk), message)
        for ws in clients:
            assert await positions(ws, 2) == [Decimal(3), Decimal(7)]
        assert time.monotonic() - sent_at >= 0.25  # it waited for the other publisher first
        assert reads == [(master.pk, lost.balances[0].seq, seq)]
        mark = await sync_to_async(deposit)(master, "8")  # the next one: a posting twice would come before it
        seq = mark.balances[0].seq
        message = {**message, "rows": await sync_to_async(rows_between)(master.pk, seq, seq)}
        await get_channel_layer().group_send(relay.account_group(master.pk), message)
        for ws in clients:
            assert await positions(ws, 1) == [Decimal(15)]
            await ws.disconnect()


async def test_the_watchers_catch_up_is_once_per_account(master, assets, monkeypatch):
    """A posting nobody published and nothing after it: the watcher sees the account's sequence
    ahead of what the hub dispatched and the hub reads it once for both connections."""
    reads = counting_reads(monkeypatch)
    key = await key_of(master)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2):
        clients = [await open_ws(key), await open_ws(key)]
        monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
        result = await sync_to_async(deposit)(master, "1")
        for ws in clients:
            assert await positions(ws, 1, timeout=3) == [Decimal(1)]
        seq = result.balances[0].seq
        assert reads == [(master.pk, seq, seq)]
        for ws in clients:
            await ws.disconnect()


async def test_a_row_still_in_flight_while_a_gap_is_read_is_waited_for_not_skipped(master, assets, monkeypatch):
    """Rolling run 5 (session 32): both websockets of one hub lacked one posting at the start of the
    load (cold publishers send late, so the hub reads gaps; its first reads are slow). The
    interleaving, forced: the hub reads a gap (s .. s+1); while it reads, s arrives (s, s+1 are
    dispatched) and s+3 arrives ahead of s+2, still on its way from another publisher. The read
    returns: s+2 is beyond what it read, so it is not "missing from the change feed" (the hub
    skipped it for good, and every connection of the process lost it): it is waited for, then read."""
    rows_between = relay.rows_between
    reads = counting_reads(monkeypatch)
    counted = relay.rows_between
    key = await key_of(master)
    reading, release = threading.Event(), threading.Event()
    with override_settings(STREAM_GAP_WAIT_SECONDS=0.3, STREAM_KEY_CHECK_SECONDS=60):
        clients = [await open_ws(key), await open_ws(key)]
        await sync_to_async(deposit)(master, "1")
        for ws in clients:
            assert await positions(ws, 1) == [Decimal(1)]
        monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)  # we publish by hand
        results = [await sync_to_async(deposit)(master, str(amount)) for amount in (2, 4, 8, 16, 32)]
        s = results[0].balances[0].seq
        rows = {row["seq"]: row for row in await sync_to_async(rows_between)(master.pk, s, s + 4)}
        assert sorted(rows) == [s, s + 1, s + 2, s + 3, s + 4]

        def slow_read(account_id, first_seq, last_seq):
            if not reading.is_set():
                reading.set()
                assert release.wait(10)
            return counted(account_id, first_seq, last_seq)

        monkeypatch.setattr(relay, "rows_between", slow_read)
        layer, group = get_channel_layer(), relay.account_group(master.pk)

        async def publish(seq: int) -> None:
            message = {"type": "ledger.changes", "account": master.pk, "email": master.email, "rows": [rows[seq]]}
            await layer.group_send(group, message)

        feed = hub_for(layer).ordering.feeds[master.pk]
        await publish(s + 1)  # s is late: after the gap's wait the hub reads s .. s+1
        await until(reading.is_set, what="the gap read under way")
        await publish(s)
        await publish(s + 3)  # s+2 is on its way
        await until(lambda: feed.last == s + 1 and s + 3 in feed.ahead, what="s dispatched, s+3 ahead")
        fills = hub_for(layer).ordering.fills
        release.set()
        await until(lambda: hub_for(layer).ordering.fills > fills, what="the read back and handled")
        assert (feed.last, sorted(feed.ahead)) == (s + 1, [s + 3])  # s+2 not skipped: still awaited
        await publish(s + 2)  # arrives within the gap's wait
        await publish(s + 4)  # the last: a duplicate or a skip would show before it
        for ws in clients:
            assert await positions(ws, 5) == [Decimal(3), Decimal(7), Decimal(15), Decimal(31), Decimal(63)]
        assert reads == [(master.pk, s, s + 1)]  # s+2 came: nothing more to read
        for ws in clients:
            await ws.disconnect()


async def test_a_connection_starting_while_the_hub_looks_up_who_listens_starts_at_its_read(master, assets, monkeypatch):
    """A message for an account the hub has no feed for (one whose last connection here just
    closed: the hub's channel leaves the group a moment later) makes the hub look up who listens
    (`Accounts.resolve`). A connection on that account that registers and starts meanwhile starts at its
    read: the row still on its way from another publisher is read after the gap's wait and given to
    it, not skipped (the hub started an account more than two minutes old at the lowest sequence
    that had arrived). Driven at the hub's own calls, to force the order."""
    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)  # we publish by hand
    await sync_to_async(User.objects.filter(pk=master.pk).update)(date_joined=timezone.now() - timedelta(days=1))
    key = await key_of(master)
    results = [await sync_to_async(deposit)(master, str(amount)) for amount in (1, 2, 4)]
    s = results[0].balances[0].seq - 1
    rows = {row["seq"]: row for row in await sync_to_async(relay.rows_between)(master.pk, s + 1, s + 3)}
    hub = hub_for(get_channel_layer())
    frees: list[Decimal] = []

    def push(texts: list[str]) -> None:
        for text in texts:
            event = json.loads(text)
            if event["e"] == "outboundAccountPosition":
                frees.append(Decimal(event["B"][0]["f"]))

    def message(seq: int) -> dict:
        return {"type": "ledger.changes", "account": master.pk, "email": master.email, "rows": [rows[seq]]}

    listener = Listener(push=push, key_closed=lambda key, message: None, failed=lambda: None)
    with override_settings(STREAM_GAP_WAIT_SECONDS=0.3, STREAM_KEY_CHECK_SECONDS=60):
        hub.receive(message(s + 2))  # s + 1 is on its way
        assert hub.ordering.feeds[master.pk].resolving
        groups, _ = hub.add_keys(listener, {key: master.pk})
        await hub.joined(groups)
        fills = hub.ordering.fills
        hub.start(listener, Read({master.pk: s}, {}, {}))
        # s + 1 is read once the gap's wait is over: it reaches the connection, not skipped.
        await until(lambda: hub.ordering.fills > fills, what="the gap's read of s + 1")
        assert frees == [Decimal(1), Decimal(3)]
        hub.receive(message(s + 1))  # late: already given, dropped
        hub.receive(message(s + 3))
        assert frees == [Decimal(1), Decimal(3), Decimal(7)]  # dispatch is synchronous: nothing else came
        hub.drop_all(listener)
        await hub.settle()


# --- many connections on one listenKey ---------------------------------------------------------------


async def test_fifty_connections_on_one_key_cost_one_copy_per_process(master, assets, monkeypatch):
    """50 connections on one listenKey: the account's group (and the key's) has one member, the
    process's hub channel; each message arrives once and each posting's events are built once; every
    connection gets every event. When they are gone the hub leaves the groups."""
    built = []
    build_events = frames.build_events

    def counted(rows, **kwargs):
        built.append(rows[0]["seq"])
        return build_events(rows, **kwargs)

    monkeypatch.setattr(frames, "build_events", counted)
    key = await key_of(master)
    layer = get_channel_layer()
    client = redis.Redis.from_url(settings.REDIS_URL)
    account_group, listen_key_group = (
        layer._group_key(relay.account_group(master.pk)),
        layer._group_key(key_group(key)),
    )

    def members(group: bytes) -> list[bytes]:
        """This process's channels in the group (account ids repeat across test runs' databases)."""
        return [name for name in client.zrange(group, 0, -1) if layer.client_prefix.encode() in name]

    with override_settings(STREAM_MAX_CONNECTIONS_PER_KEY=50):
        clients = [await open_ws(key) for _ in range(50)]
        hub = hub_for(layer)
        assert members(account_group) == [hub.channel.name.encode()]
        assert members(listen_key_group) == [hub.channel.name.encode()]
        publisher = fast_path._process_publisher(layer)
        messages, batches = hub.messages, publisher.batches
        for n in range(1, 11):
            await sync_to_async(deposit)(master, str(n))
        expected = [Decimal(n * (n + 1) // 2) for n in range(1, 11)]
        for ws in clients:
            assert await positions(ws, 10) == expected
        assert await sync_to_async(relay.drain)(5)
        sent = publisher.batches - batches  # a message per batch (of one or more postings): one account
        assert 1 <= sent <= 10
        assert hub.messages - messages == sent  # one copy of each, not 50
        assert len(built) == 10  # one build per posting, not 50
        await sync_to_async(deposit)(master, "11")  # the next one: a posting twice would come before it
        for ws in clients:
            assert await positions(ws, 1) == [Decimal(66)]
            await ws.disconnect()
    assert members(account_group) == []
    assert members(listen_key_group) == []
    assert hub.channel.receiver is None  # nobody left: the hub stopped receiving
    client.close()


async def test_the_hub_renews_its_group_memberships(master, assets):
    """Memberships expire after the layer's group_expiry (a day); a hub that stays in a group,
    one connection after the other, joins it again from the watcher's upkeep."""
    layer = get_channel_layer()
    days = [0]
    hub = hub_for(layer, clock=lambda: time.monotonic() + 86400 * days[0])  # the process's hub, a day on when told
    ws = await open_ws(await key_of(master))
    assert hub_for(layer) is hub
    client = redis.Redis.from_url(settings.REDIS_URL)
    group = layer._group_key(relay.account_group(master.pk))
    joined = client.zscore(group, hub.channel.name)
    # Scores are whole seconds: a join now would score higher once the clock is past that second.
    await until(lambda: time.time() >= int(joined) + 1, what="the next whole second")
    assert hub.channel.maintain() is None  # not due yet: not joined again
    assert client.zscore(group, hub.channel.name) == joined
    days[0] = 1
    hub.maintain()  # the watcher's upkeep
    await until(lambda: client.zscore(group, hub.channel.name) > joined, what="the membership renewed")
    await sync_to_async(deposit)(master, "1")
    assert await positions(ws, 1) == [Decimal(1)]
    await ws.disconnect()
    client.close()


# --- slow consumers ----------------------------------------------------------------------------------


async def test_a_connection_too_slow_to_take_its_frames_is_closed_and_the_others_go_on(
    master, assets, monkeypatch, caplog
):
    """One connection's frames cannot be written (its sender is stuck): once more than
    STREAM_MAX_PENDING_FRAMES wait, it is closed with 4006 (logged); the other connections on the
    account get every event, without waiting for it."""
    gate = asyncio.Event()
    stuck_consumers: list[UserDataConsumer] = []
    send_frame = UserDataConsumer._send_frame

    async def maybe_stuck(self, frame):
        if self in stuck_consumers:
            await gate.wait()
        await send_frame(self, frame)

    monkeypatch.setattr(UserDataConsumer, "_send_frame", maybe_stuck)
    key = await key_of(master)
    with override_settings(STREAM_MAX_PENDING_FRAMES=10):
        stuck = await open_ws(key)
        stuck_consumers.extend(current_consumers())  # the only one so far
        others = [await open_ws(key), await open_ws(key)]
        # 16 frames, one posting at a time: each of the others takes a posting's 2 frames before the
        # next is made, so only the stuck one ever holds more than the bound (all at once, a loaded
        # machine's burst could leave the others' senders 10 frames behind too, and closed).
        for n in range(1, 9):
            await sync_to_async(deposit)(master, str(n))
            for ws in others:
                assert await positions(ws, 1, timeout=10) == [Decimal(n * (n + 1) // 2)]
        assert await stuck.receive_output(timeout=5) == TOO_SLOW
        assert "(4006, too slow)" in caplog.text  # the connection's own check (not the hub's shedding)
        gate.set()
        await sync_to_async(deposit)(master, "9")
        for ws in others:
            assert await positions(ws, 1) == [Decimal(45)]
            await ws.disconnect()
        assert stuck.output_queue.empty()  # nothing after its close, while the others got a later event
        await stuck.disconnect()


# --- joining a busy account ----------------------------------------------------------------------------


async def _join_while_busy(
    monkeypatch, *, poster, watched, join, email: str | None = None
) -> tuple[list, list, object]:
    """Postings of `watched` flow (from two publishers) while `join()` connects or subscribes a
    connection whose read of the sequences is slow: what the hub dispatches meanwhile must reach it
    from the read's sequence on, once. Returns the frees it should get, those it got, and it."""
    starts: list[int] = []
    read_accounts = consumers.read_accounts
    feed = hub_for(get_channel_layer()).ordering.feeds[watched.pk]  # followed already, by another connection

    def slow_read(account_ids):
        read = read_accounts(account_ids)
        start = read.seqs[watched.pk]
        starts.append(start)
        # Postings go on meanwhile: the read comes back once the hub dispatched 10 more beyond it.
        wait_until(lambda: feed.last >= start + 10, what="10 postings dispatched during the read")
        return read

    count = 120
    base = feed.last
    posting = poster.post(watched.pk, count, "busy", pause=0.01)
    await until(lambda: feed.last >= base + 10, what="the account busy")
    monkeypatch.setattr(consumers, "read_accounts", slow_read)
    ws = await join()
    monkeypatch.setattr(consumers, "read_accounts", read_accounts)
    await posting
    history = await sync_to_async(committed)(watched.pk, "busy:")
    assert len(history) == count
    [start] = starts
    assert history[0][0] <= start < history[-1][0] - 20, "joined before or after the postings: no race"
    wanted = [free for seq, free in history if seq > start]
    got = await positions(ws, len(wanted), email=email)
    await poster.post(watched.pk, 1, "mark")  # the next one: a posting twice would come before it
    assert await positions(ws, 1, email=email) == [history[-1][1] + Decimal("0.00000001")]
    return wanted, got, ws


@pytest.mark.parametrize(("history", "replays"), [(ordering.HISTORY_POSTINGS, 0), (4, 1)])
async def test_a_connection_joining_a_busy_account_starts_exactly_at_its_read(
    master, assets, monkeypatch, history, replays
):
    """The account is followed already (another connection). The new connection registers, reads
    the sequence (slowly), starts there: the postings dispatched between its registration and its
    start come from the feed's recent postings, or, when those do not reach back so far, from one
    read of the database."""
    monkeypatch.setattr(ordering, "HISTORY_POSTINGS", history)
    await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    key = await key_of(master)
    first = await open_ws(key)
    poster = TwoPublishers(monkeypatch, delay=0.01)
    wanted, got, second = await _join_while_busy(monkeypatch, poster=poster, watched=master, join=lambda: open_ws(key))
    assert got == wanted
    everything = [free for _, free in await sync_to_async(committed)(master.pk, "busy:")]
    assert await positions(first, len(everything)) == everything
    assert hub_for(get_channel_layer()).listeners.replays == replays
    await first.disconnect()
    await second.disconnect()


async def test_subscribing_to_a_busy_account_starts_exactly_at_its_read(make_user, assets, monkeypatch):
    alice, bob = await sync_to_async(make_user)(), await sync_to_async(make_user)()
    await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    bob_key = await key_of(bob)
    bobs_own = await open_ws(bob_key)  # bob's account is followed already
    ws = await open_ws(await key_of(alice))

    async def subscribe():
        assert await request(ws, "SUBSCRIBE", [bob_key], 1) == {"result": None, "id": 1}
        return ws

    poster = TwoPublishers(monkeypatch, delay=0.01)
    wanted, got, _ = await _join_while_busy(monkeypatch, poster=poster, watched=bob, join=subscribe)
    assert got == wanted
    everything = [free for _, free in await sync_to_async(committed)(bob.pk, "busy:")]
    assert await positions(bobs_own, len(everything)) == everything
    # UNSUBSCRIBE: nothing more of bob's, alice's own go on.
    assert await request(ws, "UNSUBSCRIBE", [bob_key], 2) == {"result": None, "id": 2}
    await sync_to_async(deposit)(bob, "1")
    await sync_to_async(deposit)(alice, "1")  # published after bob's: bob's would come first
    assert await positions(ws, 1) == [Decimal(1)]
    await ws.disconnect()
    await bobs_own.disconnect()


async def test_a_whitelisted_master_joining_while_its_sub_account_is_busy(make_user, assets, monkeypatch):
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    sub = await sync_to_async(make_user)(master=boss)
    await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    subs_own = await open_ws(await key_of(sub))  # the sub-account is followed already, in its own view
    boss_key = await key_of(boss)
    poster = TwoPublishers(monkeypatch, delay=0.01)
    wanted, got, boss_ws = await _join_while_busy(
        monkeypatch, poster=poster, watched=sub, join=lambda: open_ws(boss_key), email=sub.email
    )
    assert got == wanted
    everything = [free for _, free in await sync_to_async(committed)(sub.pk, "busy:")]
    assert await positions(subs_own, len(everything)) == everything  # no em in the sub's own view
    await boss_ws.disconnect()
    await subs_own.disconnect()


async def test_a_new_sub_accounts_first_postings_out_of_order(make_user, assets, monkeypatch):
    """A sub-account created after its whitelisted master connected: the hub first hears of it from
    a message that carries its second posting (the first one's publisher is late). Both reach the
    master, with em, in order, without a read of the database."""
    rows_between = relay.rows_between
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    ws = await open_ws(await key_of(boss))
    reads = counting_reads(monkeypatch)
    sub = await sync_to_async(make_user)(master=boss)
    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
    first = await sync_to_async(deposit)(sub, "1")
    second = await sync_to_async(deposit)(sub, "2")
    group = relay.account_group(boss.pk)  # the relay sends a sub-account's rows to its master's group too
    hub = hub_for(get_channel_layer())
    for result in (second, first):  # the second handled before the first arrives
        seq = result.balances[0].seq
        rows = await sync_to_async(rows_between)(sub.pk, seq, seq)
        message = {"type": "ledger.changes", "account": sub.pk, "email": sub.email, "rows": rows}
        received = hub.messages
        await get_channel_layer().group_send(group, message)
        await until(lambda: hub.messages > received, what="the message handled")  # noqa: B023
    assert await positions(ws, 2, email=sub.email) == [Decimal(1), Decimal(3)]
    assert reads == []
    await ws.disconnect()


# --- one account through two keys ----------------------------------------------------------------------


async def test_one_account_through_two_keys(master, assets):
    """A connection listening to one account through two listenKeys gets each event once; closing
    one key leaves the events coming through the other (and closes the connections opened on it);
    closing the connection's own key closes it."""
    first_key = await key_of(master)
    second_key = "second" + first_key[6:]
    await sync_to_async(store().put)(second_key, master.pk, 600)
    ws = await open_ws(first_key)
    on_second = await open_ws(second_key)
    assert await request(ws, "SUBSCRIBE", [second_key], 1) == {"result": None, "id": 1}
    await sync_to_async(deposit)(master, "1")
    await sync_to_async(deposit)(master, "2")
    for each in (ws, on_second):
        assert await positions(each, 2) == [Decimal(1), Decimal(3)]  # once each: no second copy between
    await sync_to_async(services.listen_key_revoke)(key=second_key)
    assert await on_second.receive_output(timeout=1) == KEY_DEAD
    await sync_to_async(deposit)(master, "4")
    await sync_to_async(deposit)(master, "8")
    assert await positions(ws, 2) == [Decimal(7), Decimal(15)]  # through the first key, once each
    await sync_to_async(services.listen_key_revoke)(key=first_key)
    assert await ws.receive_output(timeout=1) == KEY_DEAD
    await ws.disconnect()
    await on_second.disconnect()
