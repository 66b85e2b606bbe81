"""The counters in the `limits` library's storage (Redis with a Lua script, process memory under a
lock): the ban check, the IP and UID counters and the signature check in one round trip (`Counters.take`),
the per-process `counters()`, and the storage's outage bookkeeping."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings
from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage, RedisStorage, Storage, storage_from_string
from redis.exceptions import RedisError

from exchange.api import replay_memory
from exchange.api.ratelimit.replay import (
    MEMORY_EPOCH_KEY,
    MEMORY_MARGIN_MS,
    MEMORY_SERVER_KEY,
    REDIS_NOW_MS,
    START_EPOCH_LUA,
    RestartWatch,
)
from exchange.runtime import redis_clients
from exchange.runtime.outage import Outage

logger = logging.getLogger(__package__)  # exchange.api.ratelimit, as before the split
# While the storage is away: the first failure with its traceback, then a line every 10 s, then one when it is back.
STORAGE_OUTAGE = Outage(
    logger, "Rate-limit storage unavailable: signed writes refused (-1001), other requests served and not counted"
)
STORAGE_ERRORS = (RedisError, OSError)

# KEYS: ban, memory epoch, ip counter[, uid counter[, signature]]; ARGV: window seconds, ip weight,
# uid weight, ip limit, uid limit, signature ms, signed timestamp ms. The epoch is taken from
# Redis's clock (TIME), the one clock every process shares.
# Returns {ban ms left, ip count, ip ms left, uid count, uid ms left, replayed}, replayed being 1
# for a replay and 2 for a signature older than the memory epoch. A banned caller is not counted.
# A signature already seen (or possibly seen before the storage's memory began) is refused: charged
# to the IP only (like every refusal made before the caller is known). Otherwise the signature is
# remembered unless the request is over a limit (a refused request must not spend its signature).
_TAKE_LUA = """
local ban = redis.call('PTTL', KEYS[1])
if ban > 0 then return {ban, 0, 0, -1, 0, 0} end
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  local now = redis.call('TIME')  -- one clock for every process: Redis's
  epoch = NOW_MS
  redis.call('SET', KEYS[2], epoch)
end
local function take(key, weight)
  local count = redis.call('INCRBY', key, weight)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then
    redis.call('EXPIRE', key, ARGV[1])
    ttl = tonumber(ARGV[1]) * 1000
  end
  return count, ttl
end
if #KEYS > 4 then
  local refused = 0
  if tonumber(ARGV[7]) < tonumber(epoch) + MARGIN_MS then refused = 2
  elseif redis.call('EXISTS', KEYS[5]) == 1 then refused = 1 end
  if refused > 0 then
    local ip, ip_ttl = take(KEYS[3], ARGV[2])
    return {0, ip, ip_ttl, -1, 0, refused}
  end
end
local ip, ip_ttl = take(KEYS[3], ARGV[2])
local uid, uid_ttl = -1, 0
if #KEYS > 3 then uid, uid_ttl = take(KEYS[4], ARGV[3]) end
if #KEYS > 4 and ip <= tonumber(ARGV[4]) and uid <= tonumber(ARGV[5]) then
  redis.call('SET', KEYS[5], 1, 'PX', ARGV[6], 'NX')
end
return {0, ip, ip_ttl, uid, uid_ttl, 0}
""".replace("MARGIN_MS", str(MEMORY_MARGIN_MS)).replace("NOW_MS", REDIS_NOW_MS)


def _storage_for(url: str) -> Storage:
    if not url.startswith(REDIS_SCHEMES):
        return storage_from_string(url)  # memory:// (embedded): one process, its memory is the epoch
    watch = RestartWatch()
    options = {}
    if url.startswith("redis+sentinel://"):
        # The counters' database (REDIS_URL's number); every count and the replay memory on the
        # primary (a replica's copy lags: a replayed signature could pass there).
        options = {"db": redis_clients.url_database(settings.REDIS_URL), "use_replicas": False}
        # The sentinels' own password (or None), never the URL's: limits would send them Redis's.
        options["sentinel_kwargs"] = dict(settings.REDIS_SENTINEL_KWARGS)
    storage = storage_from_string(url, redis_connect_func=watch.on_connect, **options)
    watch.keys = [storage.prefixed_key(MEMORY_SERVER_KEY), storage.prefixed_key(MEMORY_EPOCH_KEY)]
    return storage


# The storages on a Redis shared by every process (a failover through Sentinel keeps the replay
# memory honest: the new primary's run id differs, RestartWatch begins a new epoch).
REDIS_SCHEMES = ("redis://", "rediss://", "redis+unix://", "redis+sentinel://", "valkey")


@dataclass(frozen=True)
class Taken:
    ban_ms: int
    ip: int
    ip_ms: int
    uid: int | None
    uid_ms: int
    replayed: int = 0  # 1: the signature was seen before; 2: it may have been, before the memory epoch


class Counters:
    """The storage operations the gateway needs, over a `limits` storage."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self._lock = threading.Lock()
        self._redis = isinstance(storage, RedisStorage)
        self._memory_epoch: int | None = None  # in memory: when this process's storage began
        if self._redis:
            self._take_script = storage.get_connection().register_script(_TAKE_LUA)
            self._start_epoch_script = storage.get_connection().register_script(START_EPOCH_LUA)

    def _key(self, key: str) -> str:
        return self.storage.prefixed_key(key) if self._redis else key

    def take(
        self,
        ban_key: str,
        ip_key: str,
        ip_weight: int,
        uid_key: str | None,
        uid_weight: int,
        window: int,
        *,
        ip_limit: int = 0,
        uid_limit: int = 0,
        signature_key: str | None = None,
        signature_seconds: int = 0,
        signed_at_ms: int = 0,
    ) -> Taken:
        """Check the ban, add the weights and, with `signature_key` (only together with a
        `uid_key`), refuse a signature seen before, or signed (`signed_at_ms`) before the storage's
        memory epoch, or remember it for `signature_seconds` when neither count is over its limit.
        One round trip."""
        if signature_key is not None and uid_key is None:
            raise ValueError("a signature is checked only for an identified caller")
        if not self._redis:
            return self._take_memory(
                ban_key,
                ip_key,
                ip_weight,
                uid_key,
                uid_weight,
                window,
                ip_limit,
                uid_limit,
                signature_key,
                signature_seconds,
                signed_at_ms,
            )
        keys = [self._key(ban_key), self._key(MEMORY_EPOCH_KEY), self._key(ip_key)]
        if uid_key:
            keys.append(self._key(uid_key))
        if signature_key:
            keys.append(self._key(signature_key))
        ban, ip, ip_ms, uid, uid_ms, replayed = self._take_script(
            keys=keys,
            args=[window, ip_weight, uid_weight, ip_limit, uid_limit, signature_seconds * 1000, signed_at_ms],
        )
        return Taken(ban, ip, ip_ms, uid if uid_key and uid >= 0 else None, uid_ms, int(replayed))

    def _take_memory(
        self,
        ban_key,
        ip_key,
        ip_weight,
        uid_key,
        uid_weight,
        window,
        ip_limit,
        uid_limit,
        signature_key,
        signature_seconds,
        signed_at_ms,
    ) -> Taken:
        store: MemoryStorage = self.storage
        with self._lock:
            now = time.time()
            if store.get(ban_key):
                return Taken(max(1, int((store.get_expiry(ban_key) - now) * 1000)), 0, 0, None, 0)
            epoch = self._memory_epoch
            if epoch is None:
                epoch = self._memory_epoch = int(now * 1000)
            ip = store.incr(ip_key, window, amount=ip_weight)
            ip_ms = int((store.get_expiry(ip_key) - now) * 1000)
            if signature_key and signed_at_ms < epoch + MEMORY_MARGIN_MS:
                return Taken(0, ip, ip_ms, None, 0, replayed=2)
            if signature_key and store.get(signature_key):
                return Taken(0, ip, ip_ms, None, 0, replayed=1)
            uid = uid_ms = None
            if uid_key:
                uid = store.incr(uid_key, window, amount=uid_weight)
                uid_ms = int((store.get_expiry(uid_key) - now) * 1000)
            if signature_key and ip <= ip_limit and uid <= uid_limit:
                store.incr(signature_key, signature_seconds)
            return Taken(0, ip, ip_ms, uid, uid_ms or 0)

    def remember(self, key: str, seconds: int) -> bool:
        """Set `key` for `seconds` unless it is set; whether it was new (one SET NX)."""
        if self._redis:
            return bool(self.storage.get_connection().set(self._key(key), 1, ex=seconds, nx=True))
        with self._lock:
            if self.storage.get(key):
                return False
            self.storage.incr(key, seconds)
            return True

    def incr(self, key: str, seconds: int) -> int:
        return self.storage.incr(key, seconds)

    def ban(self, key: str, seconds: int) -> None:
        self.storage.clear(key)
        self.storage.incr(key, seconds)

    def clear(self, key: str) -> None:
        self.storage.clear(key)

    def reset(self) -> None:
        """Empty the storage (tests and tools that start a new world): it has seen no signature,
        so its replay memory is complete from the beginning of time."""
        self.storage.reset()
        self.set_memory_epoch(0)

    def set_memory_epoch(self, epoch_ms: int) -> None:
        """Declare that the storage has remembered every signature since `epoch_ms` (on Redis: in
        the server process that holds it now, whose run id is recorded with it)."""
        if self._redis:
            replay_memory.record(self.storage.get_connection(), epoch_ms, self.storage.key_prefix)
        else:
            with self._lock:
                self._memory_epoch = epoch_ms

    def start_memory_epoch(self) -> None:
        """At a server's start: begin the replay memory now unless it began already, so that the
        couple of seconds in which signed writes are refused after a Redis restart (or in a new
        embedded process) fall before the first client request rather than on it."""
        now_ms = time.time_ns() // 1_000_000
        if self._redis:
            self._start_epoch_script(keys=[self._key(MEMORY_EPOCH_KEY)])
        else:
            with self._lock:
                if self._memory_epoch is None:
                    self._memory_epoch = now_ms


@lru_cache(maxsize=4)
def _counters_for(url: str) -> Counters:
    return Counters(_storage_for(url))


def counters() -> Counters:
    return _counters_for(settings.RATE_LIMIT_STORAGE_URL)


def storage() -> Storage:
    return counters().storage


def start_memory_epoch() -> None:
    """Called once by each server process at start (exchange/wsgi.py, exchange/asgi.py)."""
    try:
        counters().start_memory_epoch()
    except STORAGE_ERRORS:
        logger.warning("Rate-limit storage unavailable at start; the replay memory begins with its first request")


def limit_item(counter: str) -> RateLimitItemPerMinute:
    limit = settings.IP_WEIGHT_LIMIT_PER_MINUTE if counter == "ip" else settings.UID_WEIGHT_LIMIT_PER_MINUTE
    return RateLimitItemPerMinute(limit, namespace=f"exchange-{counter}")
