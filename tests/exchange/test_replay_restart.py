"""Replay memory across a Redis restart that kept its data (exchange/api/ratelimit/replay.py, RestartWatch).

With persistence (AOF every second, as a Redis holding queues runs) or a replica promoted, the
storage comes back with its memory epoch but may have lost the last signatures it remembered: a
signed write accepted just before the crash could then be replayed. Each new connection compares
the server's run id with the one recorded and, on a different server, starts the memory epoch
again. A private redis-server is restarted for real here (SHUTDOWN, then started on its AOF)."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from exchange.api.ratelimit import (
    MEMORY_MARGIN_MS,
    MEMORY_SERVER_KEY,
    STORAGE_ERRORS,
    Counters,
    RestartWatch,
)
from exchange.api.ratelimit.storage import _storage_for
from harness.ports import free_port
from harness.private import PrivateRedis

SIGNED_WRITE = {"ip_limit": 1000, "uid_limit": 1000, "signature_seconds": 60}


@pytest.fixture
def redis_server(tmp_path):
    server = PrivateRedis(tmp_path, free_port())
    server.start()
    yield server
    server.destroy()


def _take(counters: Counters, signature: str, signed_at_ms: int):
    """One signed write's charge, retried while the connection is re-established after a restart."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return counters.take(
                "ban/192.0.2.1",
                "ip/192.0.2.1",
                1,
                "uid/7",
                1,
                60,
                signature_key=f"signature/key/{signature}",
                signed_at_ms=signed_at_ms,
                **SIGNED_WRITE,
            )
        except (RedisConnectionError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_restart_that_kept_the_data_but_lost_a_signature_refuses_its_replay(redis_server):
    counters = Counters(_storage_for(redis_server.url))
    counters.reset()  # a new world: the replay memory is complete from the beginning of time
    signed_at = _now_ms()
    assert _take(counters, "accepted-before-the-crash", signed_at).replayed == 0
    assert _take(counters, "accepted-before-the-crash", signed_at).replayed == 1  # remembered

    redis_server.stop()
    redis_server.start()  # the AOF restores everything, the memory epoch included...
    raw = redis_server.client()
    lost = counters.storage.prefixed_key("signature/key/accepted-before-the-crash")
    assert raw.delete(lost) == 1  # ...but as a crash could, it lost the last second: this signature

    # The same request again: without the restart check the storage has neither the signature nor
    # a newer epoch, and would run it a second time.
    again = _take(counters, "accepted-before-the-crash", signed_at)
    assert again.replayed == 2  # refused: -1021, signed before the replay memory began
    # An honest client signs again, with a fresh timestamp, after the couple of seconds' margin.
    assert _take(counters, "signed-after", _now_ms() + MEMORY_MARGIN_MS + 500).replayed == 0


def test_the_same_server_and_an_emptied_storage_keep_the_epoch(redis_server):
    counters = Counters(_storage_for(redis_server.url))
    counters.reset()
    old = _now_ms() - 10_000
    assert _take(counters, "first", old).replayed == 0
    # New connections to the same server process: the epoch stays where it is.
    counters.storage.get_connection().connection_pool.disconnect()
    assert _take(counters, "second", old).replayed == 0
    # Emptied (a test's or a tool's reset, which declares an empty memory complete): no restart seen.
    counters.reset()
    counters.storage.get_connection().connection_pool.disconnect()
    assert _take(counters, "first", old).replayed == 0


def test_an_epoch_without_its_server_starts_again(redis_server):
    """The run id recorded with the epoch lost (with an AOF's last second) or never written (an
    older version wrote the epoch alone): the epoch cannot be trusted and starts again."""
    counters = Counters(_storage_for(redis_server.url))
    counters.reset()
    signed_at = _now_ms()
    assert _take(counters, "accepted", signed_at).replayed == 0
    raw = redis_server.client()
    assert raw.delete(counters.storage.prefixed_key("signature/key/accepted")) == 1
    assert raw.delete(counters.storage.prefixed_key(MEMORY_SERVER_KEY)) == 1
    counters.storage.get_connection().connection_pool.disconnect()  # the next command connects anew
    assert _take(counters, "accepted", signed_at).replayed == 2


def test_a_failing_check_drops_the_connection_and_reads_as_the_storage_unreachable(redis_server, monkeypatch):
    counters = Counters(_storage_for(redis_server.url))
    counters.reset()
    counters.storage.get_connection().connection_pool.disconnect()

    def broken(self, connection):
        raise ValueError("no run id in this INFO")

    monkeypatch.setattr(RestartWatch, "_check", broken)
    with pytest.raises(STORAGE_ERRORS):  # the gateway answers -1001 for a signed write, never a 500
        counters.take("ban/x", "ip/x", 1, None, 0, 60)
    monkeypatch.undo()
    # The connection the check failed on was not kept: the next one is checked and works.
    assert _take(counters, "after", _now_ms()).replayed == 0
