"""Sending a batch of group messages: many `group_send`s in a couple of Redis round trips.

`RedisChannelLayer.group_send` costs two round trips for a group nobody listens to and four for one
with members (trim and read the group; trim the member channels; an EVAL that adds the message
under capacity), each through an event loop. `RedisGroupSender.send` does a whole batch in at most
two round trips per Redis host: one pipeline trims and reads every group, one pipeline trims every
member channel and runs one EVAL per message. It writes exactly what `group_send` writes: the same
keys, the same serialized messages (the layer's own `_map_channel_keys_to_connection`, so its
msgpack, random prefix and encryption settings), the same capacity check and expiry, by
channels_redis's own Lua script. Consumers cannot tell the difference.

That layout is channels_redis's internal business, so `RedisGroupSender` is used only with the
version it was written against (`CHANNELS_REDIS_VERSION`, pinned in requirements.txt);
tests/streams/test_fanout.py fails when the installed package's internals differ. Any other layer
or version gets `LayerSender`, which calls the layer's own `group_send` per message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from importlib.metadata import version

import redis
from channels_redis.core import RedisChannelLayer

logger = logging.getLogger(__name__)

CHANNELS_REDIS_VERSION = "4.3.0"

# Verbatim from channels_redis 4.3.0, RedisChannelLayer.group_send (the test compares the two).
GROUP_SEND_LUA = """
                local over_capacity = 0
                local current_time = ARGV[#ARGV - 1]
                local expiry = ARGV[#ARGV]
                for i=1,#KEYS do
                    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
                        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
                        redis.call('EXPIRE', KEYS[i], expiry)
                    else
                        over_capacity = over_capacity + 1
                    end
                end
                return over_capacity
            """

# Trims and reads every group of a batch in one command (what group_send does per group before
# sending: ZREMRANGEBYSCORE of members older than group_expiry, then ZRANGE).
GROUP_MEMBERS_LUA = b"""
local members = {}
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, ARGV[1])
    members[i] = redis.call('ZRANGE', KEYS[i], 0, -1)
end
return members
"""

# Consecutive messages to one channel get strictly increasing scores, so a channel's messages are
# received (lowest score first) in the order they were sent, even within one batch.
SCORE_STEP = 1e-6

Messages = Sequence[tuple[str, dict]]  # (group, message) in the order they must arrive


def batch_send_supported(layer) -> bool:
    return type(layer) is RedisChannelLayer and version("channels-redis") == CHANNELS_REDIS_VERSION


def _sync_pool(host: dict) -> redis.ConnectionPool:
    """channels_redis.utils.create_pool, with redis-py's synchronous classes."""
    host = dict(host)
    if "address" in host:
        return redis.ConnectionPool.from_url(host.pop("address"), **host)
    master_name = host.pop("master_name", None)
    if master_name is not None:
        from redis.sentinel import Sentinel, SentinelConnectionPool

        sentinels = host.pop("sentinels")
        sentinel_kwargs = host.pop("sentinel_kwargs", None)
        return SentinelConnectionPool(master_name, Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs), **host)
    return redis.ConnectionPool(**host)


def _encode(arg) -> bytes:
    # redis-py's Encoder, for the argument types used here.
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int):
        return b"%d" % arg
    if isinstance(arg, float):
        return repr(arg).encode()
    raise TypeError(f"Cannot send {type(arg).__name__} to Redis")


def pack_commands(commands: list[tuple]) -> bytes:
    """The commands in the Redis protocol (RESP), several times faster than redis-py's packer,
    which was the largest cost of a batch."""
    parts = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = _encode(arg)
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RedisGroupSender:
    """Group sends for channels_redis's RedisChannelLayer, a batch at a time, from one thread: it
    holds one connection per Redis host of the layer and writes each batch's commands in one go."""

    def __init__(self, layer: RedisChannelLayer) -> None:
        self.layer = layer
        self.pools = [_sync_pool(host) for host in layer.hosts]
        self._connections: list[redis.Connection | None] = [None] * len(self.pools)
        self.script = GROUP_SEND_LUA.encode()
        self._last_score = 0.0

    def close(self) -> None:
        for pool in self.pools:
            pool.disconnect()

    def _call(self, index: int, commands: list[tuple]) -> list:
        """The commands' replies, in one round trip (a pipeline without redis-py's Pipeline)."""
        connection = self._connections[index]
        if connection is None:
            connection = self._connections[index] = self.pools[index].get_connection()
        try:
            connection.send_packed_command([pack_commands(commands)])
            return [connection.read_response() for _ in commands]
        except BaseException:
            connection.disconnect()  # unread replies must not reach the next batch; reconnects on use
            raise

    def send(self, messages: Messages) -> None:
        if not messages:
            return
        layer = self.layer
        members = self._members({group for group, _ in messages})

        trims: dict[int, dict[str, None]] = defaultdict(dict)  # host -> member channel keys
        evals: dict[int, list[tuple[str, list, int]]] = defaultdict(list)  # host -> (group, EVAL args, channels)
        for group, message in messages:
            channels = members[group]
            if not channels:
                continue
            by_host, key_message, key_capacity = layer._map_channel_keys_to_connection(channels, message)
            for index, keys in by_host.items():
                trims[index].update(dict.fromkeys(keys))
                args = [len(keys), *keys, *(key_message[k] for k in keys), *(key_capacity[k] for k in keys)]
                evals[index].append((group, args, len(channels)))

        for index, host_evals in evals.items():
            now = time.time()
            commands = [("ZREMRANGEBYSCORE", key, 0, int(now) - int(layer.expiry)) for key in trims[index]]
            score = max(now, self._last_score + SCORE_STEP)
            for _, args, _ in host_evals:
                commands.append(("EVAL", self.script, *args, score, layer.expiry))
                self._last_score = score
                score += SCORE_STEP
            replies = self._call(index, commands)
            for (group, _, channel_count), over_capacity in zip(host_evals, replies[len(trims[index]) :], strict=True):
                if over_capacity > 0:
                    logger.info("%s of %s channels over capacity in group %s", over_capacity, channel_count, group)

    def _members(self, groups: set[str]) -> dict[str, list[str]]:
        """The channels of each group, after dropping those older than the layer's group_expiry."""
        layer = self.layer
        by_host: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            layer.require_valid_group_name(group)  # raises TypeError
            by_host[layer.consistent_hash(group)].append(group)
        members: dict[str, list[str]] = {}
        for index, host_groups in by_host.items():
            keys = [layer._group_key(group) for group in host_groups]
            oldest = int(time.time()) - layer.group_expiry
            [replies] = self._call(index, [("EVAL", GROUP_MEMBERS_LUA, len(keys), *keys, oldest)])
            for group, names in zip(host_groups, replies, strict=True):
                members[group] = [name.decode("utf8") for name in names]
        return members


class LayerSender:
    """Any other channel layer: its own group_send, one message after the other, on `loop` (the
    server's, for the in-memory layer, which lives there) or on an event loop of this thread."""

    def __init__(self, layer, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.layer = layer
        self.loop = loop
        self._own_loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        """From the thread that sent (channels_redis closes its connections in that loop)."""
        if self._own_loop is not None:
            self._own_loop.close()
            self._own_loop = None

    async def _send_all(self, messages: Messages) -> None:
        for group, message in messages:
            await self.layer.group_send(group, message)

    def send(self, messages: Messages) -> None:
        if not messages:
            return
        if self.loop is not None:
            asyncio.run_coroutine_threadsafe(self._send_all(messages), self.loop).result(timeout=30)
            return
        if self._own_loop is None:
            self._own_loop = asyncio.new_event_loop()
        self._own_loop.run_until_complete(self._send_all(messages))
