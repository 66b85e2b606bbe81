"""The relay's fast path (`streams.relay.Publisher`): postings committed concurrently are published in
batches, and every client still sees every change once and in order; rows are marked published
after they were sent; a failed send leaves them to the sweeper; the in-memory layer of the embedded
server is served on the server's event loop."""

from __future__ import annotations

import asyncio
import itertools
import time
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import override_settings

from accounts import ledger
from accounts.ledger.models import BalanceChange
from accounts.models import SystemRole
from streams import relay
from streams.relay import fast_path
from tests.support.factories import deposit
from tests.support.streams import connect, deposit_from_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def events_until(ws, wanted, timeout: float = 20) -> list[dict]:
    """Events from `ws` until `wanted(events)` holds (or the time is up)."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while not wanted(events) and time.monotonic() < deadline:
        try:
            events.append(await ws.receive_json_from(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            break
    return events


def unpublished(account_ids) -> int:
    return BalanceChange.objects.filter(account_id__in=account_ids, published_at__isnull=True).count()


def positions(events: list[dict], email: str | None = None) -> list[Decimal]:
    return [Decimal(e["B"][0]["f"]) for e in events if e["e"] == "outboundAccountPosition" and e.get("em") == email]


async def test_concurrent_postings_arrive_once_and_in_order_through_batches(make_user, assets, monkeypatch):
    """Four threads post 400 deposits to three accounts (one a whitelisted master, one its
    sub-account). Each send takes a while here (a slow Redis), so the publisher's batches hold many
    postings of each account, out of order between the threads. Each client gets every posting of
    the accounts it watches once, in sequence order: the master its own and, with `em`, its
    sub-account's."""
    plain = await sync_to_async(make_user)()
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    sub = await sync_to_async(make_user)(master=boss)
    accounts = [plain, boss, sub]
    clients = {user.pk: await connect(user) for user in accounts}
    world = await sync_to_async(ledger.system_account_id)(SystemRole.WORLD)
    count, threads = 400, 4
    publisher = fast_path._process_publisher(get_channel_layer())
    batches_before = publisher.batches
    send = publisher.sender.send

    def slow_send(messages):
        time.sleep(0.02)
        send(messages)

    monkeypatch.setattr(publisher.sender, "send", slow_send)

    posters = deposit_from_threads(world, lambda n: accounts[n % 3], count, threads, "batched")
    expected = {user.pk: [n for n in range(1, count + 1) if accounts[n % 3] is user] for user in accounts}

    def totals(account_id: int) -> list[Decimal]:
        """The free balances after each of the account's postings, in the order they committed."""
        return [
            change.free_after
            for change in BalanceChange.objects.filter(
                account_id=account_id, posting__reference__startswith="batched:"
            ).order_by("seq")
        ]

    got = {}
    try:
        for user in accounts:
            need = len(expected[user.pk]) * 2 + (len(expected[sub.pk]) * 2 if user is boss else 0)
            got[user.pk] = await events_until(clients[user.pk], lambda events, need=need: len(events) >= need)
    finally:
        await posters

    for user in accounts:
        committed = await sync_to_async(totals)(user.pk)
        assert len(committed) == len(expected[user.pk])
        own = positions(got[user.pk])
        assert own == committed  # every posting once, in commit (sequence) order
        assert all(a < b for a, b in itertools.pairwise(own))
        updates = [e for e in got[user.pk] if e["e"] == "balanceUpdate" and "em" not in e]
        assert sorted(Decimal(e["d"]) for e in updates) == sorted(Decimal(n) / 10**8 for n in expected[user.pk])
    assert positions(got[boss.pk], email=sub.email) == await sync_to_async(totals)(sub.pk)
    assert len(got[boss.pk]) == 2 * (len(expected[boss.pk]) + len(expected[sub.pk]))
    for ws in clients.values():
        assert await ws.receive_nothing(0.3)

    # Batches of many postings, and every row marked published once the publisher is drained.
    assert await sync_to_async(relay.drain)(10)
    assert publisher.batches - batches_before < count / 2
    assert await sync_to_async(unpublished)([user.pk for user in accounts]) == 0
    for ws in clients.values():
        await ws.disconnect()


async def test_a_message_with_a_hole_is_completed_from_the_database(master, assets, monkeypatch):
    """A batch may carry an account's rows n and n+2 while n+1, committed by another thread, waits for
    the next batch: the client gets n, n+1, n+2 at once, in order, and n+1 only once."""
    ws = await connect(master)
    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
    results = [await sync_to_async(deposit)(master, str(n)) for n in (1, 2, 4)]
    seqs = [r.balances[0].seq for r in results]
    layer = get_channel_layer()
    first, second, third = [await sync_to_async(relay.rows_between)(master.pk, s, s) for s in seqs]
    message = {"type": "ledger.changes", "account": master.pk, "email": master.email}
    await layer.group_send(relay.account_group(master.pk), {**message, "rows": first + third})
    frees = positions(await events_until(ws, lambda events: len(events) >= 6))
    assert frees == [Decimal(1), Decimal(3), Decimal(7)]
    await layer.group_send(relay.account_group(master.pk), {**message, "rows": second})
    assert await ws.receive_nothing(0.5)
    await ws.disconnect()


async def test_rows_are_marked_published_after_the_send(master, assets, monkeypatch):
    """Marks wait up to MARK_DELAY_SECONDS so that one UPDATE covers many batches; nothing is marked
    before it was sent."""
    monkeypatch.setattr(relay.Publisher, "MARK_DELAY_SECONDS", 0.5)
    ws = await connect(master)
    result = await sync_to_async(deposit)(master, "1")
    assert len(await events_until(ws, lambda events: len(events) >= 2)) == 2
    # Sent, not yet marked: the UPDATE waits for more.
    assert await sync_to_async(unpublished)([master.pk]) == 1
    assert await sync_to_async(relay.drain)(5)  # drain marks at once
    assert await sync_to_async(unpublished)([master.pk]) == 0
    change = await BalanceChange.objects.aget(posting_id=result.posting_id, account_id=master.pk)
    assert change.published_at is not None
    await ws.disconnect()


async def test_a_failed_send_leaves_the_rows_to_the_sweeper(master, assets, monkeypatch):
    publisher = fast_path._process_publisher(get_channel_layer())

    def broken(messages):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(publisher.sender, "send", broken)
    ws = await connect(master)
    result = await sync_to_async(deposit)(master, "1")
    assert await sync_to_async(relay.drain)(5)  # given up, not stuck
    assert await ws.receive_nothing(0.3)
    change = await BalanceChange.objects.aget(posting_id=result.posting_id, account_id=master.pk)
    assert change.published_at is None
    monkeypatch.undo()
    await sync_to_async(deposit)(master, "2")  # the next posting goes through, with the missed one before it
    frees = positions(await events_until(ws, lambda events: len(events) >= 4))
    assert frees == [Decimal(1), Decimal(3)]
    await ws.disconnect()


async def test_a_dead_publisher_thread_is_replaced(master, assets, monkeypatch):
    old = fast_path._process_publisher(get_channel_layer())
    monkeypatch.setattr(old, "alive", lambda: False)
    ws = await connect(master)
    await sync_to_async(deposit)(master, "1")
    assert len(await events_until(ws, lambda events: len(events) >= 2)) == 2
    assert fast_path._publisher is not old
    assert fast_path._publisher.alive()
    await ws.disconnect()


async def test_in_memory_layer_is_served_on_the_server_loop(master, assets, monkeypatch):
    """The embedded default: the in-memory layer lives in the server's event loop, so the
    publisher thread hands its sends to that loop."""
    monkeypatch.setattr(fast_path, "_server_process", True)
    with override_settings(CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}):
        ws = await connect(master)  # ensure_relay() records this loop
        assert fast_path._server_loop is asyncio.get_running_loop()
        await sync_to_async(deposit)(master, "1.5")
        events = await events_until(ws, lambda events: len(events) >= 2, timeout=5)
        assert [e["e"] for e in events] == ["balanceUpdate", "outboundAccountPosition"]
        assert events[1]["B"] == [{"a": "BTC", "f": "1.50000000", "l": "0.00000000"}]
        assert await sync_to_async(relay.drain)(5)
        assert await sync_to_async(unpublished)([master.pk]) == 0
        await ws.disconnect()


async def test_marking_a_posting_published_keeps_the_time_of_rows_published_before(make_user, assets, monkeypatch):
    """The fast path marks rows by posting id; a row the sweeper published first keeps its time."""
    monkeypatch.setattr("accounts.ledger.posting.api.after_commit_listeners", [])  # no publisher racing us

    def scenario():
        alice, bob = make_user(), make_user()
        world = ledger.system_account_id(SystemRole.WORLD)
        ledger.post(legs=ledger.move(world, alice.pk, "BTC", Decimal(5)), kind="OTHERS", reference="mark:fund")
        result = ledger.post(legs=ledger.move(alice.pk, bob.pk, "BTC", Decimal(1)), kind="OTHERS", reference="mark:1")
        rows = BalanceChange.objects.filter(posting_id=result.posting_id)
        assert not rows.exclude(published_at=None).exists()
        earlier = BalanceChange.objects.get(posting_id=result.posting_id, account_id=alice.pk)
        relay.mark_published([earlier.pk])
        first = BalanceChange.objects.get(pk=earlier.pk).published_at
        time.sleep(0.01)
        relay.mark_postings_published([result.posting_id])
        after = dict(rows.values_list("account_id", "published_at"))
        assert after[alice.pk] == first  # not re-marked
        assert after[bob.pk] is not None
        assert after[bob.pk] > first

    await sync_to_async(scenario)()
