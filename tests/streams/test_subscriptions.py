"""One connection, several listenKeys: SUBSCRIBE / UNSUBSCRIBE requests and their answers, the
per-connection stream limit, and what happens when a further key dies."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.test import override_settings

from streams import relay, services
from streams.consumers import UserDataConsumer
from streams.relay import fast_path
from tests.support.factories import deposit
from tests.support.streams import communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ERR_INVALID_REQUEST = -1010
ERR_TOO_MANY_STREAMS = -1015
ERR_LISTEN_KEY = -1125


async def key_of(user) -> str:
    return await sync_to_async(services.listen_key_start)(account=user)


async def connect(key: str):
    ws = communicator(key)
    connected, _ = await ws.connect()
    assert connected
    return ws


async def request(ws, method: str, params, request_id) -> dict:
    await ws.send_json_to({"method": method, "params": params, "id": request_id})
    return await ws.receive_json_from(timeout=3)


def assert_error(answer: dict, code: int, request_id) -> None:
    assert set(answer) == {"error", "id"}, answer
    assert answer["id"] == request_id
    assert set(answer["error"]) == {"code", "msg"}
    assert answer["error"]["code"] == code
    assert isinstance(answer["error"]["msg"], str)
    assert answer["error"]["msg"]


async def deposit_and_expect(ws, user, amount: str, free: str) -> None:
    """A deposit to `user` reaches `ws`: its balanceUpdate then its outboundAccountPosition."""
    await sync_to_async(deposit)(user, amount)
    update = await ws.receive_json_from(timeout=3)
    position = await ws.receive_json_from(timeout=3)
    assert update["e"] == "balanceUpdate"
    assert update["d"] == f"{Decimal(amount):.8f}"
    assert "em" not in update
    assert position["e"] == "outboundAccountPosition"
    assert position["B"] == [{"a": "BTC", "f": free, "l": "0.00000000"}]
    assert "em" not in position


@pytest.fixture
def users(make_user):
    return [make_user() for _ in range(4)]


async def test_subscribe_adds_an_account(users, assets):
    alice, bob = users[:2]
    ws = await connect(await key_of(alice))
    assert await request(ws, "SUBSCRIBE", [await key_of(bob)], 1) == {"result": None, "id": 1}
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    await deposit_and_expect(ws, bob, "2", "2.00000000")
    await deposit_and_expect(ws, alice, "3", "4.00000000")
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_unsubscribe_stops_that_accounts_events(users, assets):
    alice, bob = users[:2]
    bob_key = await key_of(bob)
    ws = await connect(await key_of(alice))
    assert await request(ws, "SUBSCRIBE", [bob_key], 1) == {"result": None, "id": 1}
    await deposit_and_expect(ws, bob, "2", "2.00000000")
    assert await request(ws, "UNSUBSCRIBE", [bob_key], 2) == {"result": None, "id": 2}
    await sync_to_async(deposit)(bob, "3")
    assert await ws.receive_nothing(0.5)
    # The primary account's events go on.
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_resubscribing_does_not_replay_what_happened_in_between(users, assets):
    """Events of an account while it was unsubscribed are not the connection's: after a new
    SUBSCRIBE only new events arrive, as on a first SUBSCRIBE."""
    alice, bob = users[:2]
    bob_key = await key_of(bob)
    ws = await connect(await key_of(alice))
    assert await request(ws, "SUBSCRIBE", [bob_key], 1) == {"result": None, "id": 1}
    await deposit_and_expect(ws, bob, "1", "1.00000000")
    assert await request(ws, "UNSUBSCRIBE", [bob_key], 2) == {"result": None, "id": 2}
    await sync_to_async(deposit)(bob, "2")  # while unsubscribed
    assert await ws.receive_nothing(0.5)
    assert await request(ws, "SUBSCRIBE", [bob_key], 3) == {"result": None, "id": 3}
    await deposit_and_expect(ws, bob, "4", "7.00000000")
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_unsubscribing_the_connections_own_key_is_ignored(users, assets):
    alice = users[0]
    alice_key = await key_of(alice)
    ws = await connect(alice_key)
    assert await request(ws, "UNSUBSCRIBE", [alice_key], 5) == {"result": None, "id": 5}
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    await ws.disconnect()


async def test_unsubscribing_an_unknown_key_is_harmless(users, assets):
    alice = users[0]
    ws = await connect(await key_of(alice))
    assert await request(ws, "UNSUBSCRIBE", ["nope"], 6) == {"result": None, "id": 6}
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    await ws.disconnect()


async def test_subscribe_with_a_dead_key_is_1125(users, assets):
    alice, bob, carol = users[:3]
    bob_key = await key_of(bob)
    await sync_to_async(services.listen_key_close)(account=bob, key=bob_key)
    carol_key = await key_of(carol)
    ws = await connect(await key_of(alice))
    assert_error(await request(ws, "SUBSCRIBE", [bob_key], 3), ERR_LISTEN_KEY, 3)
    assert_error(await request(ws, "SUBSCRIBE", ["x" * 60], 4), ERR_LISTEN_KEY, 4)
    # A request with one dead key adds none of its keys.
    assert_error(await request(ws, "SUBSCRIBE", [carol_key, bob_key], 5), ERR_LISTEN_KEY, 5)
    await sync_to_async(deposit)(carol, "1")
    assert await ws.receive_nothing(0.5)
    # The connection is still open and usable.
    assert await request(ws, "SUBSCRIBE", [carol_key], 6) == {"result": None, "id": 6}
    await deposit_and_expect(ws, carol, "2", "3.00000000")
    await ws.disconnect()


async def test_a_subscribed_key_that_dies_is_dropped_and_the_connection_stays(users, assets):
    alice, bob = users[:2]
    bob_key = await key_of(bob)
    ws = await connect(await key_of(alice))
    assert await request(ws, "SUBSCRIBE", [bob_key], 1) == {"result": None, "id": 1}
    await sync_to_async(services.listen_key_close)(account=bob, key=bob_key)
    assert await ws.receive_nothing(0.3)  # no close: it was not the connection's own key
    await sync_to_async(deposit)(bob, "1")
    assert await ws.receive_nothing(0.5)
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    await ws.disconnect()


async def test_events_already_queued_for_a_key_closed_meanwhile_are_not_sent(users, assets, monkeypatch):
    """A posting of bob's is on its way to the connection when bob's key is closed (a busy event
    loop: the consumer takes a moment before it handles the close). The close comes first, so
    bob's events are no longer this connection's: they must not be sent, least of all dressed as a
    sub-account's events (em, BI), bob being nobody's sub-account."""
    alice, bob = users[:2]
    bob_key = await key_of(bob)
    gate = asyncio.Event()
    on_close = UserDataConsumer.listenkey_closed

    async def slow_close(self, event):
        await gate.wait()
        await on_close(self, event)

    monkeypatch.setattr(UserDataConsumer, "listenkey_closed", slow_close)
    ws = await connect(await key_of(alice))
    assert await request(ws, "SUBSCRIBE", [bob_key], 1) == {"result": None, "id": 1}
    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: False)
    result = await sync_to_async(deposit)(bob, "1")
    seq = result.balances[-1].seq
    rows = await sync_to_async(relay.rows_between)(bob.pk, seq, seq)
    await sync_to_async(services.listen_key_close)(account=bob, key=bob_key)  # queues listenkey.closed
    await get_channel_layer().group_send(  # then bob's posting, as the relay sends it
        relay.account_group(bob.pk), {"type": "ledger.changes", "account": bob.pk, "email": bob.email, "rows": rows}
    )
    gate.set()
    assert await ws.receive_nothing(0.5)
    await ws.disconnect()


async def test_a_subscribed_key_that_expires_is_dropped(users, assets):
    alice, bob = users[:2]
    alice_key = await key_of(alice)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2, LISTEN_KEY_TTL_SECONDS=1):
        bob_key = await key_of(bob)
        ws = await connect(alice_key)
        assert await request(ws, "SUBSCRIBE", [bob_key], 1) == {"result": None, "id": 1}
        assert await ws.receive_nothing(1.6)  # bob's key expired, no close for alice's connection
        await sync_to_async(deposit)(bob, "1")
        assert await ws.receive_nothing(0.5)
        await deposit_and_expect(ws, alice, "1", "1.00000000")
    await ws.disconnect()


@pytest.mark.parametrize(
    ("payload", "request_id"),
    [
        ({"method": "LIST_SUBSCRIPTIONS", "id": 7}, 7),
        ({"method": "SUBSCRIBE", "params": "not-a-list", "id": 8}, 8),
        ({"method": "SUBSCRIBE", "params": [1, 2], "id": 9}, 9),
        ({"method": "UNSUBSCRIBE", "id": 10}, 10),
        ({"params": [], "id": 11}, 11),
        ([1, 2, 3], None),
        ("SUBSCRIBE", None),
    ],
)
async def test_invalid_requests_get_an_error_object(users, assets, payload, request_id):
    alice = users[0]
    ws = await connect(await key_of(alice))
    await ws.send_json_to(payload)
    assert_error(await ws.receive_json_from(timeout=3), ERR_INVALID_REQUEST, request_id)
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    await ws.disconnect()


async def test_invalid_json_gets_an_error_object(users, assets):
    alice = users[0]
    ws = await connect(await key_of(alice))
    await ws.send_to(text_data="{not json")
    assert_error(await ws.receive_json_from(timeout=3), ERR_INVALID_REQUEST, None)
    # The connection survives it.
    await deposit_and_expect(ws, alice, "1", "1.00000000")
    await ws.disconnect()


async def test_stream_limit_per_connection(users, assets):
    _alice, bob, carol, dave = users
    keys = [await key_of(user) for user in users]
    with override_settings(STREAM_MAX_STREAMS_PER_CONNECTION=3):
        ws = await connect(keys[0])
        # The same key twice (and the connection's own key) counts once: 3 streams in all.
        answer = await request(ws, "SUBSCRIBE", [keys[1], keys[1], keys[0], keys[2]], 1)
        assert answer == {"result": None, "id": 1}
        assert_error(await request(ws, "SUBSCRIBE", [keys[3]], 2), ERR_TOO_MANY_STREAMS, 2)
        # Refused as a whole: dave's events do not arrive.
        await sync_to_async(deposit)(dave, "1")
        assert await ws.receive_nothing(0.5)
        # Subscribing keys already there is no new stream.
        assert await request(ws, "SUBSCRIBE", [keys[2], keys[1]], 3) == {"result": None, "id": 3}
        # Freeing a place lets another in.
        assert await request(ws, "UNSUBSCRIBE", [keys[2]], 4) == {"result": None, "id": 4}
        assert await request(ws, "SUBSCRIBE", [keys[3]], 5) == {"result": None, "id": 5}
        await deposit_and_expect(ws, dave, "2", "3.00000000")
        await deposit_and_expect(ws, bob, "1", "1.00000000")
        await sync_to_async(deposit)(carol, "1")
        assert await ws.receive_nothing(0.5)
        await ws.disconnect()


async def test_default_limit_is_1024():
    assert settings.STREAM_MAX_STREAMS_PER_CONNECTION == 1024


async def test_two_connections_of_one_account_both_receive(users, assets):
    alice = users[0]
    key = await key_of(alice)
    first = await connect(key)
    second = await connect(key)
    await sync_to_async(deposit)(alice, "1")
    for ws in (first, second):
        assert [(await ws.receive_json_from(timeout=3))["e"] for _ in range(2)] == [
            "balanceUpdate",
            "outboundAccountPosition",
        ]
    # Closing one connection leaves the other subscribed.
    await first.disconnect()
    await deposit_and_expect(second, alice, "2", "3.00000000")
    await second.disconnect()


async def test_an_account_subscribed_twice_gets_each_event_once(make_user, assets):
    """A whitelisted master subscribing its sub-account's key hears the sub's events over two
    groups (its own and the sub's); the client gets them once, without em."""
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    sub = await sync_to_async(make_user)(master=boss)
    ws = await connect(await key_of(boss))
    assert await request(ws, "SUBSCRIBE", [await key_of(sub)], 1) == {"result": None, "id": 1}
    await deposit_and_expect(ws, sub, "1", "1.00000000")
    assert await ws.receive_nothing(0.5)
    await ws.disconnect()
