"""Where listenKeys live: Redis keys with a TTL in the full stack (`streams:lk:<key>` -> account id,
`streams:active:<account>` -> key), a dict in process memory in the embedded default (one server
process holds the websockets there).

The store also counts open websocket connections per listenKey and per client IP, for the caps of
consumers.py, across every server process: a connection holds a lease (a sorted-set member scored
with its expiry) in `streams:conns:lk:<key>` and `streams:conns:ip:<ip>`; its process's watcher
renews it while the connection lives and the connection returns it when it closes, so the leases of
a crashed process stop counting after `lease` seconds. In memory there is one process: plain sets.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from exchange.runtime import redis_clients

# Why a connection is refused by connection_open.
OVER_KEY_CAP = "listenKey"
OVER_IP_CAP = "ip"


@dataclass(frozen=True)
class Lease:
    """One open connection's place in the counts: `ip` is None when the peer is unknown (not counted per IP)."""

    connection: str
    key: str
    ip: str | None


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deletions = 0  # keys deleted (closed or revoked): the watchers' cue
        self._keys: dict[str, tuple[int, float]] = {}
        self._active: dict[int, str] = {}
        self._conns: dict[str, set[str]] = defaultdict(set)

    def _alive(self, key: str) -> int | None:
        entry = self._keys.get(key)
        if entry is None:
            return None
        if entry[1] <= time.time():
            self._keys.pop(key, None)
            return None
        return entry[0]

    def owner(self, key: str) -> int | None:
        with self._lock:
            return self._alive(key)

    def owners(self, keys: list[str]) -> dict[str, int | None]:
        with self._lock:
            return {key: self._alive(key) for key in keys}

    def active_key(self, account_id: int) -> str | None:
        with self._lock:
            key = self._active.get(account_id)
            return key if key is not None and self._alive(key) == account_id else None

    def put(self, key: str, account_id: int, ttl: int) -> None:
        with self._lock:
            self._keys[key] = (account_id, time.time() + ttl)
            self._active[account_id] = key

    def extend(self, key: str, ttl: int) -> bool:
        with self._lock:
            account = self._alive(key)
            if account is None:
                return False
            self._keys[key] = (account, time.time() + ttl)
            return True

    def delete(self, key: str) -> int | None:
        with self._lock:
            account = self._alive(key)
            self._keys.pop(key, None)
            if account is not None and self._active.get(account) == key:
                self._active.pop(account, None)
            self._deletions += 1
            return account

    def deletions(self) -> int:
        return self._deletions

    def server_time(self) -> float:
        """The embedded default is one host: its own clock."""
        return time.time()

    def ttl(self, key: str) -> float | None:
        with self._lock:
            entry = self._keys.get(key)
            return None if entry is None else max(0.0, entry[1] - time.time())

    def connection_open(self, lease: Lease, *, key_cap: int, ip_cap: int, seconds: float) -> str | None:
        """Count the connection, or say which cap it would exceed (and count nothing)."""
        names = _lease_sets(lease, prefix="")
        with self._lock:
            for name, cap, refusal in zip(names, (key_cap, ip_cap), (OVER_KEY_CAP, OVER_IP_CAP), strict=False):
                members = self._conns.get(name, ())
                if lease.connection not in members and len(members) >= cap:
                    return refusal
            for name in names:
                self._conns[name].add(lease.connection)
            return None

    def connection_close(self, lease: Lease) -> None:
        with self._lock:
            for name in _lease_sets(lease, prefix=""):
                members = self._conns.get(name)
                if members is not None:
                    members.discard(lease.connection)
                    if not members:
                        del self._conns[name]

    def connections_renew(self, leases: list[Lease], *, seconds: float) -> None:
        """Nothing to do: one process, whose connections return their leases when they close."""

    def connection_count(self, *, key: str | None = None, ip: str | None = None) -> int:
        with self._lock:
            return len(self._conns.get(f"lk:{key}" if key is not None else f"ip:{ip}", ()))


def _lease_sets(lease: Lease, prefix: str) -> list[str]:
    names = [f"{prefix}lk:{lease.key}"]
    if lease.ip is not None:
        names.append(f"{prefix}ip:{lease.ip}")
    return names


# KEYS: the listenKey's set, then the IP's (optional). ARGV: connection, now, lease expiry, key cap,
# IP cap, seconds to keep a set. Expired leases (a crashed process's) are dropped before counting.
OPEN_CONNECTION_LUA = """
local caps = {tonumber(ARGV[4]), tonumber(ARGV[5])}
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[2])
    if not redis.call('ZSCORE', KEYS[i], ARGV[1]) and redis.call('ZCARD', KEYS[i]) >= caps[i] then
        return i
    end
end
for i = 1, #KEYS do
    redis.call('ZADD', KEYS[i], ARGV[3], ARGV[1])
    redis.call('EXPIRE', KEYS[i], ARGV[6])
end
return 0
"""


class RedisStore:
    PREFIX = "streams:lk:"
    ACTIVE = "streams:active:"
    CONNS = "streams:conns:"
    DELETIONS = "streams:deletions"

    def __init__(self, url: str) -> None:
        # Timeouts: a Redis that does not answer fails the request (-1126, -1001) instead of holding it.
        self.redis = redis_clients.client(url, decode_responses=True, socket_connect_timeout=3, socket_timeout=5)
        self._open_connection = self.redis.register_script(OPEN_CONNECTION_LUA)

    def owner(self, key: str) -> int | None:
        value = self.redis.get(self.PREFIX + key)
        return int(value) if value is not None else None

    def owners(self, keys: list[str]) -> dict[str, int | None]:
        """Many keys' accounts in one round trip."""
        if not keys:
            return {}
        values = self.redis.mget([self.PREFIX + key for key in keys])
        return {key: int(value) if value is not None else None for key, value in zip(keys, values, strict=True)}

    def active_key(self, account_id: int) -> str | None:
        key = self.redis.get(self.ACTIVE + str(account_id))
        return key if key is not None and self.owner(key) == account_id else None

    def put(self, key: str, account_id: int, ttl: int) -> None:
        pipe = self.redis.pipeline()
        pipe.set(self.PREFIX + key, account_id, ex=ttl)
        pipe.set(self.ACTIVE + str(account_id), key, ex=ttl)
        pipe.execute()

    def extend(self, key: str, ttl: int) -> bool:
        account = self.owner(key)
        if account is None or not self.redis.expire(self.PREFIX + key, ttl):
            return False
        self.redis.expire(self.ACTIVE + str(account), ttl)
        return True

    def delete(self, key: str) -> int | None:
        account = self.owner(key)
        self.redis.delete(self.PREFIX + key)
        if account is not None and self.redis.get(self.ACTIVE + str(account)) == key:
            self.redis.delete(self.ACTIVE + str(account))
        self.redis.incr(self.DELETIONS)  # after the delete: a watcher that sees it sees the key gone
        return account

    def deletions(self) -> int:
        """How many keys were deleted (closed or revoked), ever: a watcher that sees this change
        checks its connections' keys at once (streams/watcher.py)."""
        return int(self.redis.get(self.DELETIONS) or 0)

    def server_time(self) -> float:
        """Redis's clock (TIME), the one clock every process of the stack reads (streams/clock.py)."""
        seconds, micros = self.redis.time()
        return seconds + micros / 1e6

    def ttl(self, key: str) -> float | None:
        millis = self.redis.pttl(self.PREFIX + key)
        return None if millis < 0 else millis / 1000

    def connection_open(self, lease: Lease, *, key_cap: int, ip_cap: int, seconds: float) -> str | None:
        """Count the connection, or say which cap it would exceed (and count nothing); one round trip."""
        now = time.time()
        refused = self._open_connection(
            keys=_lease_sets(lease, prefix=self.CONNS),
            args=[lease.connection, now, now + seconds, key_cap, ip_cap, int(seconds) + 1],
        )
        return {0: None, 1: OVER_KEY_CAP, 2: OVER_IP_CAP}[int(refused)]

    def connection_close(self, lease: Lease) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for name in _lease_sets(lease, prefix=self.CONNS):
            pipe.zrem(name, lease.connection)
        pipe.execute()

    def connections_renew(self, leases: list[Lease], *, seconds: float) -> None:
        """Extend the leases of a process's live connections (one round trip). Only existing members
        are renewed (XX): a connection that closed meanwhile is not counted again."""
        if not leases:
            return
        expiry = time.time() + seconds
        pipe = self.redis.pipeline(transaction=False)
        names: set[str] = set()
        for lease in leases:
            for name in _lease_sets(lease, prefix=self.CONNS):
                pipe.zadd(name, {lease.connection: expiry}, xx=True)
                names.add(name)
        for name in names:
            pipe.expire(name, int(seconds) + 1)
        pipe.execute()

    def connection_count(self, *, key: str | None = None, ip: str | None = None) -> int:
        name = self.CONNS + (f"lk:{key}" if key is not None else f"ip:{ip}")
        return self.redis.zcount(name, time.time(), "+inf")


def connection_lease_seconds() -> float:
    """How long a connection's count outlives its process; its watcher renews it every third of that."""
    return max(60.0, 6 * settings.STREAM_KEY_CHECK_SECONDS)


@lru_cache(maxsize=4)
def _store_for(url: str):
    return RedisStore(url) if url else MemoryStore()


def store():
    return _store_for(settings.REDIS_URL)
