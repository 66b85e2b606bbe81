"""The hub's collaborators alone (streams/hub/), each made with what it needs: the channel on a layer
of the test's, the ordering with rows out of order and a reader of the test's, what the hub knows of
accounts, the listener registry on those three. No database, no Redis channel layer, no sleeps: a
clock of the test's where time matters. (The fairness meter's own tests are in test_hub_fairness.py;
the hub as a whole, on the real PostgreSQL and Redis, in test_hub.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import override_settings

from streams import relay
from streams.events import row_payload
from streams.hub import AccountInfo, Accounts, Channel, Listener, Listeners, Ordering, Read
from streams.hub.accounts import INFO_SECONDS
from streams.services import key_group
from tests.support.waiting import until


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Layer:
    """A channel layer of the test's: it records the group calls; `queue` is what the channel receives."""

    group_expiry = 86400

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.queue: asyncio.Queue = asyncio.Queue()

    async def new_channel(self) -> str:
        return "hub.test!1"

    async def group_add(self, group: str, channel: str) -> None:
        self.calls.append(("add", group))

    async def group_discard(self, group: str, channel: str) -> None:
        self.calls.append(("discard", group))

    async def receive(self, channel: str) -> dict:
        return await self.queue.get()


def rows(*seqs: int) -> list[dict]:
    """One deposit posting per sequence (1 BTC each: free is the sequence)."""
    return [
        row_payload(
            seq=seq,
            asset="BTC",
            precision=8,
            delta_free="1",
            delta_locked="0",
            free=str(seq),
            locked="0",
            kind="CHAIN_DEPOSIT",
            posting_id=seq,
            created_ms=0,
        )
        for seq in seqs
    ]


# --- the channel ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_group_is_joined_once_however_many_need_it_and_left_when_none_does():
    layer = Layer()
    channel = Channel(layer, asyncio.get_running_loop(), handle=lambda message: None)
    channel.ref("g", +1)
    channel.ref("g", +1)
    await channel.joined(["g"])
    channel.ref("g", -1)
    await channel.settle()
    assert layer.calls == [("add", "g")]
    assert channel.needed()
    channel.ref("g", -1)
    await channel.settle()
    assert layer.calls == [("add", "g"), ("discard", "g")]
    assert not channel.needed()


@pytest.mark.asyncio
async def test_memberships_are_renewed_on_the_channels_clock():
    layer, clock = Layer(), Clock()
    channel = Channel(layer, asyncio.get_running_loop(), handle=lambda message: None, clock=clock)
    channel.ref("g", +1)
    await channel.joined(["g"])
    clock.now += 3600  # min(an hour, a quarter of the layer's group_expiry): not yet
    assert channel.maintain() is None
    clock.now += 1
    await channel.maintain()
    assert layer.calls == [("add", "g"), ("add", "g")]
    assert channel.maintain() is None  # the next renewal an hour on


@pytest.mark.asyncio
async def test_each_message_goes_to_the_handler_and_one_it_cannot_handle_does_not_stop_the_loop(caplog):
    layer, handled = Layer(), []

    def handle(message: dict) -> None:
        if message["type"] == "broken":
            raise ValueError("broken")
        handled.append(message["type"])

    channel = Channel(layer, asyncio.get_running_loop(), handle=handle)
    channel.receive()
    for kind in ("broken", "ledger.changes", "listenkey.closed"):
        layer.queue.put_nowait({"type": kind})
    await until(lambda: len(handled) == 2, what="both good messages handled")
    assert handled == ["ledger.changes", "listenkey.closed"]
    assert "could not handle a broken message" in caplog.text
    channel.stop()


# --- the ordering ----------------------------------------------------------------------------------------


class Reads:
    """The ordering's reader of rows: records each read, answers from `rows_of` (the database)."""

    def __init__(self, *seqs: int) -> None:
        self.stored = {row["seq"]: row for row in rows(*seqs)}
        self.calls: list[tuple[int, int, int]] = []

    async def __call__(self, account: int, first: int, upto: int) -> list[dict]:
        self.calls.append((account, first, upto))
        return [self.stored[seq] for seq in range(first, upto + 1) if seq in self.stored]


def ordering_of(reads: Reads) -> tuple[Ordering, list[list[int]]]:
    loop = asyncio.get_running_loop()
    dispatched: list[list[int]] = []
    ordering = Ordering(
        loop,
        spawn=loop.create_task,
        dispatch=lambda feed, postings: dispatched.append([posting.last for posting in postings]),
        clock=Clock(),
        read=reads,
    )
    return ordering, dispatched


@pytest.mark.asyncio
@override_settings(STREAM_GAP_WAIT_SECONDS=60)
async def test_rows_out_of_order_are_dispatched_in_order_once_without_a_read():
    reads = Reads()
    ordering, dispatched = ordering_of(reads)
    feed = ordering.feed(7)
    ordering.add(feed, rows(2))
    assert dispatched == []  # not started: held
    ordering.begin(feed, 0)
    assert (dispatched, ordering.waits, feed.behind()) == ([], 1, True)  # 1 is missing: it waits
    ordering.add(feed, rows(3))
    ordering.add(feed, rows(1))
    ordering.add(feed, rows(2, 3))  # duplicates (the sweeper resending)
    assert dispatched == [[1, 2, 3]]
    assert not feed.behind()
    assert (ordering.fills, reads.calls) == (0, [])
    assert ordering.followed() == [7]
    ordering.stop()


@pytest.mark.asyncio
@override_settings(STREAM_GAP_WAIT_SECONDS=0)
async def test_a_gap_still_missing_after_the_wait_is_read_once_for_the_account():
    reads = Reads(1, 2, 3)
    ordering, dispatched = ordering_of(reads)
    feed = ordering.feed(7)
    ordering.begin(feed, 0)
    ordering.add(feed, rows(3))
    await until(lambda: dispatched, what="the gap read")
    assert dispatched == [[1, 2, 3]]
    assert (ordering.fills, reads.calls) == (1, [(7, 1, 3)])
    ordering.stop()


@pytest.mark.asyncio
@override_settings(STREAM_GAP_WAIT_SECONDS=0)
async def test_the_watchers_catch_up_reads_what_no_message_carried():
    reads = Reads(1, 2, 3)
    ordering, dispatched = ordering_of(reads)
    feed = ordering.feed(7)
    ordering.begin(feed, 0)
    ordering.add(feed, rows(1))
    ordering.catch_up({7: 3, 8: 5})  # 8: not followed here
    await until(lambda: len(dispatched) == 2, what="the catch-up read")
    assert dispatched == [[1], [2, 3]]
    assert reads.calls == [(7, 2, 3)]
    ordering.stop()


# --- what the hub knows of accounts ----------------------------------------------------------------------


def test_a_sub_account_is_wanted_while_its_whitelisted_masters_connections_are_here():
    clock = Clock()
    ordering = Ordering(None, spawn=None, dispatch=lambda feed, postings: None, clock=clock)
    accounts = Accounts(ordering, spawn=None, master_changed=lambda account, masters: None, clock=clock)
    accounts.learn(2, AccountInfo("sub@example.com", master=1, whitelisted=True, joined=0.0))
    assert (accounts.watched_by(2), accounts.subs(1)) == (1, {2})
    assert not accounts.wanted(2)
    assert not accounts.may_want(2)  # known, and nobody here listens to its master
    accounts.interested(1)
    assert accounts.wanted(2)
    assert accounts.may_want(2)
    ordering.feed(2)
    accounts.uninterested(1)
    accounts.forget_unwanted([2])
    assert ordering.get(2) is None
    clock.now += INFO_SECONDS + 1
    assert accounts.may_want(2)  # what was known is old: find out again
    clock.now += INFO_SECONDS
    accounts.maintain()
    assert (accounts.info(2), accounts.subs(1)) == (None, set())


# --- the listener registry ---------------------------------------------------------------------------------


class Parts:
    """A registry on a channel (of a test layer), an ordering and accounts of its own."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.layer, self.charges = Layer(), []
        self.channel = Channel(self.layer, loop, handle=lambda message: None)
        self.ordering = Ordering(loop, self.channel.spawn, lambda *run: self.registry.dispatch(*run))
        self.accounts = Accounts(
            self.ordering, self.channel.spawn, lambda account, masters: self.registry.master_changed(account, masters)
        )
        self.registry = Listeners(
            self.channel, self.ordering, self.accounts, lambda *charge: self.charges.append(charge)
        )

    def close(self) -> None:
        self.ordering.stop()
        self.channel.stop()


def connection() -> tuple[Listener, list[dict]]:
    events: list[dict] = []
    listener = Listener(
        push=lambda frames: events.extend(json.loads(text) for text in frames),
        key_closed=lambda key, message: None,
        failed=lambda: None,
    )
    return listener, events


def frees(events: list[dict]) -> list[str]:
    return [event["B"][0]["f"] for event in events if event["e"] == "outboundAccountPosition"]


@pytest.mark.asyncio
async def test_two_keys_of_one_account_need_its_group_once_until_the_last_is_dropped():
    parts = Parts()
    listener, _ = connection()
    groups, accounts = parts.registry.add_keys(listener, {"k1": 7})
    assert (groups, accounts) == ([key_group("k1"), relay.account_group(7)], [7])
    more, accounts = parts.registry.add_keys(listener, {"k2": 7, "k1": 7})
    assert (more, accounts) == ([key_group("k2")], [])
    await parts.channel.joined(groups + more)
    assert sorted(parts.layer.calls) == sorted(("add", group) for group in groups + more)
    parts.registry.drop_key(listener, "k1")
    await parts.channel.settle()
    assert ("discard", relay.account_group(7)) not in parts.layer.calls
    assert parts.ordering.get(7) is not None
    parts.registry.drop_key(listener, "k2")
    await parts.channel.settle()
    assert ("discard", relay.account_group(7)) in parts.layer.calls
    assert not parts.channel.needed()
    assert parts.ordering.get(7) is None  # nobody here listens: the feed is forgotten
    parts.close()


@pytest.mark.asyncio
@override_settings(STREAM_GAP_WAIT_SECONDS=60)
async def test_connections_get_each_posting_once_in_order_from_their_start():
    parts = Parts()
    first, first_events = connection()
    parts.registry.add_keys(first, {"k1": 7})
    parts.registry.start(first, Read({7: 5}, {}, {}))
    feed = parts.ordering.get(7)
    parts.ordering.add(feed, rows(7))
    parts.ordering.add(feed, rows(4, 6))  # 4: history (before its start)
    parts.ordering.add(feed, rows(6, 7))  # again
    assert frees(first_events) == ["6.00000000", "7.00000000"]
    assert parts.charges == [(7, 2, 0)]  # two writes, for money the account received: not its doing
    # A second connection that read 5 while the hub dispatched 6 and 7: from the feed's recent postings.
    second, second_events = connection()
    parts.registry.add_keys(second, {"k2": 7})
    parts.registry.start(second, Read({7: 5}, {}, {}))
    assert frees(second_events) == ["6.00000000", "7.00000000"]
    assert parts.registry.replays == 0
    assert set(parts.registry.audience(7)) == {first, second}
    parts.registry.drop_all(first)
    parts.ordering.add(feed, rows(8))
    assert (frees(first_events)[-1], frees(second_events)[-1]) == ("7.00000000", "8.00000000")
    parts.registry.drop_all(second)
    await parts.channel.settle()
    parts.close()


@pytest.mark.asyncio
@override_settings(STREAM_GAP_WAIT_SECONDS=60)
async def test_a_whitelisted_masters_connection_gets_its_sub_accounts_postings_in_its_view():
    parts = Parts()
    master, events = connection()
    parts.registry.add_keys(master, {"k": 1})
    sub = AccountInfo("sub@example.com", master=1, whitelisted=True, joined=0.0)
    parts.registry.start(master, Read({1: 0, 2: 4}, {2: sub}, {2: 1}))
    parts.ordering.add(parts.ordering.get(2), rows(5))
    assert [event.get("em") for event in events] == ["sub@example.com", "sub@example.com"]
    assert frees(events) == ["5.00000000"]
    assert parts.registry.audience(2) == [master]
    # The operators take the whitelisting back: the master's connection forgets the sub-account.
    parts.accounts.learn(2, AccountInfo("sub@example.com", master=1, whitelisted=False, joined=0.0))
    parts.registry.master_changed(2, {1})
    assert parts.registry.audience(2) == []
    parts.ordering.add(parts.ordering.get(2), rows(6))
    assert frees(events) == ["5.00000000"]
    parts.registry.drop_all(master)
    await parts.channel.settle()
    parts.close()
