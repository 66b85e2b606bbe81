"""Weighted request limits per IP and per UID, and the 418 ban for clients that ignore a 429.

Counters live in the `limits` library's storage: Redis in the full stack, process memory in the
embedded default. Each counter is a fixed one-minute window (the `limits` item's key and expiry)
that starts at its first request; refused requests count too, so hammering keeps a client refused.
A client that sends another request after having been told 429 in the same window is banned:
2 minutes for a first offence, doubling per offence within the last 3 days, capped at 3 days.
Bans are rows of `exchange.RateLimitBan` (visible and liftable in the admin) mirrored into the
storage, which is what the request path reads.

One request costs one storage round trip: the ban check, both counters and, for a signed write,
the replay check of its signature are taken together (a Lua script on Redis; the same steps under
one lock in memory), because the gateway charges a request once it knows who is calling and the
signature has passed every other check.

Replay refusal never fails open (docs/security.md):
- storage unreachable: counting fails open (logged), but a signed write is refused with -1001;
- storage emptied (a Redis restart without persistence, a flush, a new embedded process): the
  storage keeps a "memory epoch" key, the time it started remembering signatures, written by the
  first request that finds it missing. A signed write whose timestamp is not clearly after that
  time (MEMORY_MARGIN_MS, covering the future tolerance and clocks of other processes) could have
  been accepted before the storage forgot it, so it is refused with -1021 (sign again with a fresh
  timestamp). This lasts a couple of seconds after a restart for honest clients.
- storage restarted with its data, or failed over to a replica (persistence restores the epoch, but
  an AOF written every second, or a replica behind its master, can still lose the last signatures
  remembered): every new connection to Redis compares the server's `run_id` (INFO) with the one
  recorded in the storage; when it differs, the memory epoch starts again now, before the
  connection's first command (`RestartWatch`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage, RedisStorage, Storage, storage_from_string
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from exchange import replay_memory
from exchange.api.errors import (
    IpBanned,
    ReplayCheckUnavailable,
    SignatureReplayed,
    TimestampBeforeReplayMemory,
    TooManyRequests,
)
from exchange.models import RateLimitBan
from exchange.outage import Outage

logger = logging.getLogger(__name__)
# While the storage is away: the first failure with its traceback, then a line every 10 s, then one when it is back.
STORAGE_OUTAGE = Outage(
    logger, "Rate-limit storage unavailable: signed writes refused (-1001), other requests served and not counted"
)

# The least IP weight of a request refused before its caller is known (a failed authentication, an
# unknown path, a malformed request), whatever the endpoint's own weights: such a request is never
# free, even where a known caller pays by UID only (IP weight 0).
REFUSAL_WEIGHT = 1

USED_WEIGHT_HEADER = "X-SERVICE-USED-WEIGHT-1M"
USED_UID_WEIGHT_HEADER = "X-SERVICE-USED-UID-WEIGHT-1M"
STORAGE_ERRORS = (RedisError, OSError)

# Signatures are not checked against a storage that may have forgotten them: a signed write is
# refused unless its timestamp is at least this long after the storage's memory epoch.
MEMORY_MARGIN_MS = 2000
MEMORY_EPOCH_KEY = replay_memory.EPOCH_KEY

# Redis's clock in milliseconds, as text, from `local now = redis.call('TIME')` (one clock for every process).
_NOW_MS = "tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))"

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
""".replace("MARGIN_MS", str(MEMORY_MARGIN_MS)).replace("NOW_MS", _NOW_MS)


# KEYS: the recorded server run id, the memory epoch; ARGV: this server's run id. Returns 0 (same server),
# 1 (no epoch either: the storage is new or was emptied, and its first request starts the epoch) or
# 2 (another server than the one recorded holds the data, or an epoch without a recorded server -
# written by an older version, or its run id lost with the last second of an AOF: the memory epoch
# starts now). Whoever empties the storage declares it complete with both keys (replay_memory).
_RESTART_LUA = """
local known = redis.call('GET', KEYS[1])
if known == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
if not known and redis.call('EXISTS', KEYS[2]) == 0 then return 1 end
local now = redis.call('TIME')
redis.call('SET', KEYS[2], NOW_MS)
return 2
""".replace("NOW_MS", _NOW_MS)
MEMORY_SERVER_KEY = replay_memory.SERVER_KEY


class RestartWatch:
    """redis-py's connect hook (`redis_connect_func`) for the limits storage: after the handshake,
    before the connection's first command, it reads the server's run id and, if the storage's data
    was last written by another server process (a restart that restored its AOF or RDB, a replica
    promoted), starts the memory epoch again. Every connection is new after a restart, so no
    signed write is checked against a replay memory that may have lost its last entries."""

    def __init__(self) -> None:
        self.keys: list[str] = []  # the prefixed MEMORY_SERVER_KEY and MEMORY_EPOCH_KEY

    def on_connect(self, connection) -> None:
        connection.on_connect()
        try:
            restarted, run_id = self._check(connection)
        except RedisError:
            raise
        except Exception as exc:
            # Anything else would escape as a 500 and leave the unchecked connection in the pool:
            # redis-py drops a connection whose hook raises one of its own errors.
            raise RedisConnectionError(f"replay memory check failed: {type(exc).__name__}: {exc}") from exc
        if restarted:
            logger.warning(
                "Rate-limit storage: another Redis server process (run id %s) holds the data; the replay "
                "memory starts again now (signed writes signed before it are refused -1021)",
                run_id,
            )

    def _check(self, connection) -> tuple[bool, str]:
        connection.send_command("INFO", "server")
        info = connection.read_response()
        info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
        run_id = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("run_id:")), "")
        if not run_id:
            raise RedisConnectionError("the server's INFO has no run_id")
        connection.send_command("EVAL", _RESTART_LUA, len(self.keys), *self.keys, run_id)
        return connection.read_response() == 2, run_id


def _storage_for(url: str) -> Storage:
    if not url.startswith(("redis://", "rediss://", "redis+unix://", "valkey")):
        return storage_from_string(url)  # memory:// (embedded): one process, its memory is the epoch
    watch = RestartWatch()
    storage = storage_from_string(url, redis_connect_func=watch.on_connect)
    watch.keys = [storage.prefixed_key(MEMORY_SERVER_KEY), storage.prefixed_key(MEMORY_EPOCH_KEY)]
    return storage


_START_EPOCH_LUA = """
local now = redis.call('TIME')
return redis.call('SET', KEYS[1], NOW_MS, 'NX')
""".replace("NOW_MS", _NOW_MS)


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
            self._start_epoch_script = storage.get_connection().register_script(_START_EPOCH_LUA)

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


def ban_key(ip: str) -> str:
    return f"exchange/ban/{ip}"


def _warned_key(ip: str) -> str:
    return f"exchange/warned/{ip}"


def forgive(ip: str) -> None:
    """Forget an IP's ban, warning and current IP window (a lifted ban lets it in at once)."""
    store = counters()
    for key in (ban_key(ip), _warned_key(ip), _item("ip").key_for(ip)):
        store.clear(key)


# Bans: the rows (what ops see and lift in the admin) and their mirror in the storage (what the
# request path reads), kept together here.


def ban_duration_seconds(*, offence: int) -> int:
    """2 minutes for a first offence, doubling with each repeat, at most 3 days (settings)."""
    low, high = settings.RATE_LIMIT_BAN_MIN_SECONDS, settings.RATE_LIMIT_BAN_MAX_SECONDS
    return min(high, low * 2 ** min(offence - 1, 40))


def rate_limit_ban_create(*, ip: str, reason: str) -> RateLimitBan:
    now = timezone.now()
    escalation_start = now - timedelta(seconds=settings.RATE_LIMIT_BAN_MAX_SECONDS)
    offence = RateLimitBan.objects.filter(ip=ip, created_at__gte=escalation_start).count() + 1
    duration = ban_duration_seconds(offence=offence)
    with transaction.atomic():
        ban = RateLimitBan.objects.create(
            ip=ip,
            offence=offence,
            duration_seconds=duration,
            reason=reason[:200],
            expires_at=now + timedelta(seconds=duration),
        )
    counters().ban(ban_key(ip), duration)
    logger.warning("IP %s banned for %s s (offence %s): %s", ip, duration, offence, reason)
    return ban


def rate_limit_ban_lift(*, ban: RateLimitBan, lifted_by=None) -> RateLimitBan:
    """End a ban now. Lifting an older ban of an address lifts the address."""
    now = timezone.now()
    with transaction.atomic():
        RateLimitBan.objects.filter(ip=ban.ip, lifted_at__isnull=True, expires_at__gt=now).update(
            lifted_at=now, lifted_by=lifted_by
        )
    forgive(ban.ip)
    ban.refresh_from_db()
    logger.info("Ban of %s lifted by %s", ban.ip, lifted_by)
    return ban


def _item(counter: str) -> RateLimitItemPerMinute:
    limit = settings.IP_WEIGHT_LIMIT_PER_MINUTE if counter == "ip" else settings.UID_WEIGHT_LIMIT_PER_MINUTE
    return RateLimitItemPerMinute(limit, namespace=f"exchange-{counter}")


def apply_weight_headers(request, response) -> None:
    http_request = getattr(request, "_request", request)
    used = getattr(http_request, "_used_weight", None)
    if used is None:
        return
    if used.get("ip") is not None:
        response[USED_WEIGHT_HEADER] = str(used["ip"])
    if used.get("uid") is not None:
        response[USED_UID_WEIGHT_HEADER] = str(used["uid"])


def signature_key(api_key: str, signature: str) -> str:
    return f"exchange/signature/{api_key}/{signature}"


def charge(
    http_request,
    *,
    ip: str,
    ip_weight: int,
    uid: int | None = None,
    uid_weight: int = 0,
    signature: tuple[str, str, int, int] | None = None,
) -> None:
    """Refuse a banned IP (418); add the weights to the IP and UID counters; refuse over a limit
    (429, and 418 with a new ban for a client that continues after its 429); then, for a signed
    write (`signature` = (api key, lower-case signature, seconds it stays valid, its timestamp)),
    refuse a signature used before (-1022) or signed before the storage's memory epoch (-1021), or
    remember it. One storage round trip; a signed write is refused (-1001) when the storage cannot
    be reached.

    Call it with a signature only once the request has passed every other check of the gateway:
    a request refused for its signature, timing, key or IP must not spend its signature."""
    ip_item = _item("ip")
    uid_item = _item("uid") if uid is not None else None
    try:
        taken = counters().take(
            ban_key(ip),
            ip_item.key_for(ip),
            ip_weight,
            uid_item.key_for(str(uid)) if uid_item else None,
            uid_weight,
            ip_item.get_expiry(),
            ip_limit=ip_item.amount,
            uid_limit=uid_item.amount if uid_item else 0,
            signature_key=signature_key(signature[0], signature[1]) if signature else None,
            signature_seconds=signature[2] if signature else 0,
            signed_at_ms=signature[3] if signature else 0,
        )
    except STORAGE_ERRORS as exc:
        # Limits protect capacity, not money: an outage of their storage must not stop reads. A
        # signed write moves or changes something: without the replay check it could be run twice.
        STORAGE_OUTAGE.failed(exc)
        if signature:
            raise ReplayCheckUnavailable() from exc
        return
    STORAGE_OUTAGE.ok()
    if taken.ban_ms:
        _refuse_banned(taken.ban_ms / 1000)
    used = http_request.__dict__.setdefault("_used_weight", {})
    used["ip"] = taken.ip
    if taken.uid is not None:
        used["uid"] = taken.uid
    if taken.ip > ip_item.amount:
        _over_limit(ip, "ip", taken.ip, ip_item.amount, taken.ip_ms)
    if taken.replayed == 1:
        raise SignatureReplayed()
    if taken.replayed == 2:
        raise TimestampBeforeReplayMemory()
    if uid_item is not None and taken.uid > uid_item.amount:
        _over_limit(ip, "uid", taken.uid, uid_item.amount, taken.uid_ms)


def _refuse_banned(seconds_left: float) -> None:
    retry_after = max(1, math.ceil(seconds_left))
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + retry_after))
    raise IpBanned(until, headers={"Retry-After": str(retry_after)})


def _over_limit(ip: str, counter: str, count: int, limit: int, window_ms: int) -> None:
    retry_after = max(1, math.ceil(window_ms / 1000))
    try:
        warned = counters().incr(_warned_key(ip), retry_after)
    except STORAGE_ERRORS:
        warned = 1
    if warned == 1:
        raise TooManyRequests(limit, "1 minute", headers={"Retry-After": str(retry_after)})
    if warned == 2:  # exactly one request per window creates the ban
        ban = rate_limit_ban_create(ip=ip, reason=f"continued after 429 on the {counter} limit ({count}/{limit})")
        _refuse_banned(ban.duration_seconds)
    _refuse_banned(retry_after)  # the ban is being recorded by a concurrent request
