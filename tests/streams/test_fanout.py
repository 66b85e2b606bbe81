"""`streams.fanout.RedisGroupSender` writes what channels_redis's own `group_send` writes (keys,
messages, scores, capacity, expiry), in a couple of round trips per batch. It relies on
channels_redis internals, so these tests pin them: they fail when the installed package differs from
the version the sender was written against."""

from __future__ import annotations

import asyncio
import inspect
import time
from importlib.metadata import version

import pytest
import redis
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from streams import fanout

PREFIX = f"fanout-test-{time.time_ns()}"


@pytest.fixture
def layer():
    """A layer of its own (prefix, small capacity) on the tests' Redis; its keys removed afterwards."""
    layer = RedisChannelLayer(hosts=[{"address": settings.REDIS_URL}], prefix=PREFIX, capacity=5, expiry=60)
    yield layer
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{PREFIX}*"):
        client.delete(key)
    client.close()


def raw() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


async def drain_channel(layer, channel: str, limit: int = 50) -> list[dict]:
    """What the channel holds, in the order it is received."""
    messages = []
    while len(messages) < limit:
        try:
            messages.append(await asyncio.wait_for(layer.receive(channel), 0.3))
        except TimeoutError:
            break
    return messages


# --- the pinned internals ------------------------------------------------------------------------


def test_installed_channels_redis_is_the_pinned_version():
    assert version("channels-redis") == fanout.CHANNELS_REDIS_VERSION
    assert fanout.batch_send_supported(get_channel_layer())


def test_group_send_internals_are_those_the_sender_copies():
    """The Lua script is channels_redis's, verbatim; the key layout, the trims and the helper the
    sender calls are those of the installed group_send."""
    source = inspect.getsource(RedisChannelLayer.group_send)
    assert fanout.GROUP_SEND_LUA in source
    for line in (
        "key = self._group_key(group)",
        "connection = self.connection(self.consistent_hash(group))",
        "key, min=0, max=int(time.time()) - self.group_expiry",
        "await connection.zrange(key, 0, -1)",
        "self._map_channel_keys_to_connection(channel_names, message)",
        "key, min=0, max=int(time.time()) - int(self.expiry)",
        "args += [time.time(), self.expiry]",
        "group_send_lua, len(channel_redis_keys), *channel_redis_keys, *args",
    ):
        assert line in source, line
    mapping = inspect.getsource(RedisChannelLayer._map_channel_keys_to_connection)
    assert 'message["__asgi_channel__"] = [channel]' in mapping
    assert "channel_key_to_capacity[channel_key] = self.get_capacity(channel)" in mapping
    assert "idx = self.consistent_hash(channel_non_local_name)" in mapping
    layer = RedisChannelLayer()
    assert layer._group_key("g") == b"asgi:group:g"
    assert layer.serialize({"a": 1}) != layer.serialize({"a": 1})  # a random prefix: unique zset members


def test_another_version_or_layer_falls_back_to_group_send(monkeypatch):
    from channels.layers import InMemoryChannelLayer

    assert not fanout.batch_send_supported(InMemoryChannelLayer())
    monkeypatch.setattr(fanout, "version", lambda name: "4.4.0")
    assert not fanout.batch_send_supported(RedisChannelLayer())


def test_pack_commands_is_the_redis_protocol():
    commands = [
        ("ZREMRANGEBYSCORE", "asgispecific.x!", 0, 1700000000),
        ("EVAL", fanout.GROUP_SEND_LUA.encode(), 1, "asgispecific.x!", b"\x00\xffmsg", 5000, time.time(), 60),
        ("ZRANGE", b"asgi:group:\xc3\xa9", 0, -1),
    ]
    assert fanout.pack_commands(commands) == b"".join(redis.Connection().pack_commands(commands))
    with pytest.raises(TypeError):
        fanout.pack_commands([("GET", None)])


# --- the same effect as group_send ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_batch_reaches_every_member_like_group_send(layer):
    """Process-local channels (sharing one key), a plain channel, two groups, several messages:
    each channel receives, in order, what group_send would have given it."""
    local_a, local_b = await layer.new_channel(), await layer.new_channel()
    for group, channel in (("g1", local_a), ("g1", local_b), ("g1", "plain.one"), ("g2", local_a)):
        await layer.group_add(group, channel)
    sender = fanout.RedisGroupSender(layer)
    sender.send(
        [
            ("g1", {"type": "m", "n": 1}),
            ("g2", {"type": "m", "n": 2}),
            ("g1", {"type": "m", "n": 3}),
            ("nobody", {"type": "m", "n": 4}),
        ]
    )
    assert [m["n"] for m in await drain_channel(layer, local_a)] == [1, 2, 3]
    assert [m["n"] for m in await drain_channel(layer, local_b)] == [1, 3]
    assert [m["n"] for m in await drain_channel(layer, "plain.one")] == [1, 3]

    # Byte for byte the layout group_send leaves: the same keys, TTLs and (deserialized) messages.
    await layer.group_send("g1", {"type": "m", "n": 5})
    client = raw()
    via_layer = {key: client.zrange(key, 0, -1) for key in client.scan_iter(f"{PREFIX}*") if b"group" not in key}
    ttl_layer = {key: client.ttl(key) for key in via_layer}
    for key in via_layer:
        client.delete(key)
    sender.send([("g1", {"type": "m", "n": 5})])
    via_sender = {key: client.zrange(key, 0, -1) for key in client.scan_iter(f"{PREFIX}*") if b"group" not in key}
    assert via_sender.keys() == via_layer.keys()
    for key, members in via_sender.items():
        assert [layer.deserialize(m) for m in members] == [layer.deserialize(m) for m in via_layer[key]]
        assert abs(client.ttl(key) - ttl_layer[key]) <= 1
    client.close()


@pytest.mark.asyncio
async def test_many_messages_to_one_channel_keep_their_order(layer):
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    layer.capacity = 1000
    sender = fanout.RedisGroupSender(layer)
    sender.send([("g", {"type": "m", "n": n}) for n in range(300)])
    sender.send([("g", {"type": "m", "n": n}) for n in range(300, 400)])
    assert [m["n"] for m in await drain_channel(layer, channel, limit=1000)] == list(range(400))


@pytest.mark.asyncio
async def test_capacity_drops_like_group_send(layer):
    """A channel holds at most `capacity` (5) messages: the rest are dropped, as group_send does.
    (Plain channels: a process's specific channels share one Redis key, and its capacity.)"""
    batched, plain = "plain.batched", "plain.group-send"
    await layer.group_add("batched", batched)
    await layer.group_add("plain", plain)
    fanout.RedisGroupSender(layer).send([("batched", {"type": "m", "n": n}) for n in range(7)])
    for n in range(7):
        await layer.group_send("plain", {"type": "m", "n": n})
    assert [m["n"] for m in await drain_channel(layer, batched)] == [0, 1, 2, 3, 4]
    assert [m["n"] for m in await drain_channel(layer, plain)] == [0, 1, 2, 3, 4]


@pytest.mark.asyncio
async def test_expired_members_and_messages_are_trimmed_like_group_send(layer):
    client = raw()
    group_key = layer._group_key("g")
    await layer.group_add("g", "plain.fresh")
    client.zadd(group_key, {"plain.stale": time.time() - layer.group_expiry - 10})
    stale_message = layer.serialize({"type": "m", "n": "old"})
    client.zadd(layer.prefix + "plain.fresh", {stale_message: time.time() - layer.expiry - 10})
    fanout.RedisGroupSender(layer).send([("g", {"type": "m", "n": 1})])
    assert client.zrange(group_key, 0, -1) == [b"plain.fresh"]
    assert not client.exists(layer.prefix + "plain.stale")
    assert [m["n"] for m in await drain_channel(layer, "plain.fresh")] == [1]
    client.close()


@pytest.mark.asyncio
async def test_round_trips(layer, monkeypatch):
    """One round trip when nobody listens, two when someone does, whatever the batch size."""
    sender = fanout.RedisGroupSender(layer)
    calls = []
    original = sender._call
    monkeypatch.setattr(
        sender, "_call", lambda index, commands: calls.append(len(commands)) or original(index, commands)
    )
    sender.send([(f"g{n}", {"type": "m", "n": n}) for n in range(50)])
    assert len(calls) == 1
    await layer.group_add("g7", "plain.seven")
    await layer.group_add("g9", "plain.nine")
    calls.clear()
    sender.send([(f"g{n}", {"type": "m", "n": n}) for n in range(50)])
    assert len(calls) == 2


@pytest.mark.asyncio
async def test_a_broken_connection_is_replaced(layer):
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    sender = fanout.RedisGroupSender(layer)
    sender.send([("g", {"type": "m", "n": 1})])
    sender._connections[0]._sock.close()  # the server went away under us
    with pytest.raises(redis.RedisError):
        sender.send([("g", {"type": "m", "n": 2})])
    sender.send([("g", {"type": "m", "n": 3})])
    assert [m["n"] for m in await drain_channel(layer, channel)] == [1, 3]


@pytest.mark.asyncio
async def test_layer_sender_calls_group_send_from_a_thread_of_its_own(layer):
    import threading

    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    sender = fanout.LayerSender(layer)

    def publisher_thread() -> None:
        sender.send([("g", {"type": "m", "n": 1}), ("g", {"type": "m", "n": 2})])
        sender.close()

    thread = threading.Thread(target=publisher_thread)
    thread.start()
    thread.join(10)
    assert [m["n"] for m in await drain_channel(layer, channel)] == [1, 2]
