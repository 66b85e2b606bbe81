"""The gateway's cache of API keys, one "keyring" per account: the account's row and all its keys.

Every signed request needs its key (secret, types, status, IP list) and its account; reading them
from the database on each request costs more than the rest of the gateway together. So each
process keeps keyrings in memory:

- an entry lives at most API_KEY_CACHE_SECONDS (default 10);
- any save or delete of an ApiKey or a User evicts that account's keyring at once in this process
  and, after commit, in every process through a Redis pub/sub message (signals in apps.py);
- the same after-commit step appends the account to the *revocation log* in Redis (a counter and a
  sorted set, one Lua script, so entries are never seen out of order), which a thread of every
  process reads every API_KEY_REVOCATION_SECONDS / 4 (one round trip, off the request path); a
  process trusts its cached keyrings only while its last complete read of the log started less
  than API_KEY_REVOCATION_SECONDS (1) ago, else it reloads from the database. Pub/sub messages
  are fire-and-forget (a subscriber that reconnects, or a publish that fails, loses them): the log
  is what bounds a revocation to API_KEY_REVOCATION_SECONDS in every process. The request path
  pays one comparison of two floats for it;
- a key's secret is decrypted when its keyring is loaded and kept only as a keyed HMAC
  (`KeyRecord.signer`, left out of repr): decrypting it on every request cost about 5% of a
  request's CPU, and a process that can be read can already decrypt every secret with the
  encryption keys it holds, so this exposes nothing more. The database keeps them encrypted.

So a disabled key is refused immediately by the process that disabled it and within milliseconds
by the others; if the pub/sub message is lost, within API_KEY_REVOCATION_SECONDS. Only a process
that dies between its commit and its after-commit step (it writes neither) leaves the others on
API_KEY_CACHE_SECONDS at worst.

Without Redis (the embedded `make run`) the server is one process, but `manage.py` commands (an
operator's `apikey disable`, a shell) change keys from others, on the same database (issue 34,
finding 4: the server trusted its cache for ever). There the revocation log is two tables of that
database (accounts.models.RevocationSequence and RevocationLog): the change's own transaction bumps
the counter (its row lock orders the entries as they commit) and appends the account, so the entry
commits with the change or not at all (a save made outside a transaction has committed already:
its entry follows at once, in a transaction of its own); every process reads the entries after the last one it saw
every API_KEY_REVOCATION_SECONDS / 4 (two small queries) and trusts its cache on the same terms as
above. The streams' watcher follows the same reads (`revocations()`, streams/watcher.py).

Unknown keys are remembered too (issue 25, finding 5): each one the database did not know costs a
query, so a process asks about the same unknown key at most once per API_KEY_CACHE_SECONDS. A key
created later must work at once, and the invalidation of its account names the account, not the
key: so any invalidation this process hears of (the same three ways as above) forgets every
unknown key, and a remembered one is trusted on the same terms as a keyring (the revocation log
read recently). A newly created key is therefore usable as soon as a disabled one is refused. The
gateway charges every failed authentication to the caller's IP (exchange/api/views.py), which bounds
how many different unknown keys one address can have looked up.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from cryptography.fernet import InvalidToken
from django.conf import settings
from django.db import close_old_connections, connection, transaction

from accounts.crypto import decrypt_secret
from accounts.ledger.posting import fetch_prepared
from accounts.models import FUNCTIONAL_KEY_TYPES, ApiKey, ApiKeyStatus, User
from accounts.revocation_log import DATABASE_LOG_ID, LOG_LENGTH, log_revocation
from accounts.revocation_log import read as _read_database_log
from exchange.api.signing import signer
from exchange.runtime import redis_clients
from exchange.runtime.outage import Outage

logger = logging.getLogger(__name__)
# The two Redis readers below retry every second (quarter second) while Redis is away: logged once,
# then every 10 s, then when they are back (exchange/runtime/outage.py).
LISTEN_OUTAGE = Outage(logger, "Keyring invalidation listener lost Redis; retrying every second", settle=0.0)
LOG_OUTAGE = Outage(logger, "Cannot read the keyring revocation log; keys come from the database", settle=0.0)

INVALIDATE_CHANNEL = "exchange:keyring:invalidate"  # + ":<database number>", see _channel
# The revocation log: a counter, the log's identity (a Redis that lost its data starts a new log)
# and a sorted set of "account:sequence" scored by sequence, trimmed to LOG_LENGTH entries.
LOG_KEYS = ("exchange:keyring:seq", "exchange:keyring:log-id", "exchange:keyring:log")
_LOG_APPEND = """
redis.call('SET', KEYS[2], ARGV[2], 'NX')
local n = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[3], n, ARGV[1] .. ':' .. string.format('%d', n))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', n - tonumber(ARGV[3]))
return n
"""
# Returns {log id, sequence, [members after ARGV[1]]}; no members (only the sequence) when the
# reader is further behind than the log is long: it must then forget everything.
_LOG_READ = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local id = redis.call('GET', KEYS[2]) or ''
local last = tonumber(ARGV[1])
if n <= last or n - last > tonumber(ARGV[2]) then return {id, n} end
return {id, n, redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf')}
"""
MAX_KEYRINGS = 50_000
MAX_UNKNOWN_KEYS = 50_000
_USER_FIELDS = tuple(f.attname for f in User._meta.concrete_fields)


@dataclass(frozen=True)
class KeyRecord:
    key: str
    name: str
    secret_ciphertext: str
    types: tuple[str, ...]
    status: str
    ip_restrict: bool
    ip_list: tuple[str, ...]
    created_at_ms: int
    signer: hmac.HMAC | None = field(default=None, repr=False, compare=False)  # keyed with the secret

    @property
    def is_read_only(self) -> bool:
        return not any(t in self.types for t in FUNCTIONAL_KEY_TYPES)

    @property
    def is_enabled(self) -> bool:
        return self.status == ApiKeyStatus.ENABLE


@dataclass(frozen=True)
class Keyring:
    user_id: int
    user_values: tuple
    keys: tuple[KeyRecord, ...]
    expires_at: float

    def account(self) -> User:
        """A fresh User instance per request (cached instances are never handed out)."""
        return User.from_db("default", _USER_FIELDS, self.user_values)

    def find(self, key: str) -> KeyRecord | None:
        for record in self.keys:
            if record.key == key:
                return record
        return None


def _signer_of(key: str, secret_ciphertext: str) -> hmac.HMAC | None:
    """The key's keyed HMAC, or None when its secret cannot be decrypted (e.g. its encryption key
    was dropped from API_SECRET_ENCRYPTION_KEYS): that key's requests are then refused as badly
    signed (-1022), and the account's other keys keep working."""
    try:
        return signer(decrypt_secret(secret_ciphertext))
    except InvalidToken:
        logger.error("API key %s…: its secret cannot be decrypted with the configured keys", key[:8])
        return None


def _key_record(key: str, name: str, secret_ciphertext: str, types, status, ip_restrict, ip_list, created_at):
    return KeyRecord(
        key=key,
        name=name,
        secret_ciphertext=secret_ciphertext,
        types=tuple(types),
        status=status,
        ip_restrict=ip_restrict,
        ip_list=tuple(ip_list),
        created_at_ms=int(created_at.timestamp() * 1000),
        signer=_signer_of(key, secret_ciphertext),
    )


# PostgreSQL: the account and its keys in one prepared statement (two ORM queries cost ~10 times
# its time: a keyring is loaded whenever one expires, API_KEY_CACHE_SECONDS after its last load).
_LOAD_STATEMENT = (
    "SELECT "  # noqa: S608 - constant text: the model's own column names
    + ", ".join(f"u.{connection.ops.quote_name(User._meta.get_field(name).column)}" for name in _USER_FIELDS)
    + ", k.key, k.name, k.secret_ciphertext, k.types, k.status, k.ip_restrict, k.ip_list, k.created_at"
    " FROM accounts_user u LEFT JOIN accounts_apikey k ON k.user_id = u.id WHERE u.id = %s ORDER BY k.id"
)


def _json(value):
    """A jsonb column as Django's connection hands it over (text; decoded already elsewhere)."""
    return json.loads(value) if isinstance(value, str) else value


def _load(user_id: int) -> Keyring | None:
    if connection.vendor == "postgresql":
        rows = fetch_prepared(_LOAD_STATEMENT, [user_id])
        if not rows:
            return None
        width = len(_USER_FIELDS)
        values = rows[0][:width]
        keys = tuple(
            _key_record(key, name, ciphertext, _json(types), status, ip_restrict, _json(ip_list), created)
            for key, name, ciphertext, types, status, ip_restrict, ip_list, created in (row[width:] for row in rows)
            if key is not None
        )
    else:  # SQLite (the embedded mode): the ORM converts its values
        values = User.objects.filter(pk=user_id).values_list(*_USER_FIELDS).first()
        if values is None:
            return None
        keys = tuple(
            _key_record(k.key, k.name, k.secret_ciphertext, k.types, k.status, k.ip_restrict, k.ip_list, k.created_at)
            for k in ApiKey.objects.filter(user_id=user_id).order_by("id")
        )
    return Keyring(
        user_id=user_id, user_values=values, keys=keys, expires_at=time.monotonic() + settings.API_KEY_CACHE_SECONDS
    )


class KeyringCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keyrings: OrderedDict[int, Keyring] = OrderedDict()
        self._owner: dict[str, int] = {}  # api key -> user id
        # Bumped by evictions (per account, and all at once by clear): a load that overlapped one may
        # hold pre-change rows, so it is used for its own request but not cached.
        self._epoch = 0
        self._generation: dict[int, int] = {}
        # Keys the database did not know: key -> (expires at, _changes when the database was asked).
        # Bumped by every invalidation (evict, clear): the change may have created one of them.
        self._unknown: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._changes = 0
        self._subscriber: threading.Thread | None = None
        self._subscribed = threading.Event()
        # The revocation log as this process last read it (only the reader thread writes these).
        self._log_reader: threading.Thread | None = None
        self._log_position: tuple[str, int] | None = None  # (log id, sequence)
        # Cached keyrings are used until then: the start of the last complete read of the log (Redis's,
        # or the database's without Redis) plus API_KEY_REVOCATION_SECONDS. A float, so that the
        # request path reads no setting (a setting costs ~3 us, this check ~0.1 us).
        self._trust_until = -math.inf
        self._synced = threading.Event()

    def _fresh(self, ring: Keyring | None, now: float) -> bool:
        """Whether a cached keyring may be used: not expired, and this process read the revocation
        log recently enough."""
        return ring is not None and ring.expires_at > now and now < self._trust_until

    def _get(self, user_id: int) -> Keyring | None:
        with self._lock:
            ring = self._keyrings.get(user_id)
            if self._fresh(ring, time.monotonic()):
                self._keyrings.move_to_end(user_id)
                return ring
        return None

    def _put(self, ring: Keyring, generation: tuple[int, int]) -> None:
        with self._lock:
            if generation != (self._epoch, self._generation.get(ring.user_id, 0)):
                return
            self._keyrings[ring.user_id] = ring
            self._keyrings.move_to_end(ring.user_id)
            for record in ring.keys:
                self._owner[record.key] = ring.user_id
            while len(self._keyrings) > MAX_KEYRINGS:
                _, old = self._keyrings.popitem(last=False)
                for record in old.keys:
                    self._owner.pop(record.key, None)

    def for_user(self, user_id: int) -> Keyring | None:
        self._ensure_subscriber()
        ring = self._get(user_id)
        if ring is None:
            with self._lock:
                generation = (self._epoch, self._generation.get(user_id, 0))
            ring = _load(user_id)
            if ring is not None:
                self._put(ring, generation)
        return ring

    def cached(self, key: str) -> bool:
        """Whether `key` can be answered without the database (known, or known to be unknown)."""
        now = time.monotonic()
        with self._lock:
            user_id = self._owner.get(key)
            ring = self._keyrings.get(user_id) if user_id is not None else None
            unknown = ring is None and self._known_unknown(key, now)
        return unknown or self._fresh(ring, now)

    def _known_unknown(self, key: str, now: float) -> bool:
        """Whether the database said `key` does not exist, recently enough and with no invalidation
        since (called under the lock)."""
        entry = self._unknown.get(key)
        if entry is None:
            return False
        expires_at, changes = entry
        if changes == self._changes and expires_at > now and now < self._trust_until:
            return True
        del self._unknown[key]
        return False

    def _remember_unknown(self, key: str, changes: int) -> None:
        with self._lock:
            if changes != self._changes:  # an invalidation overlapped the query: it may have created the key
                return
            self._unknown[key] = (time.monotonic() + settings.API_KEY_CACHE_SECONDS, changes)
            self._unknown.move_to_end(key)
            while len(self._unknown) > MAX_UNKNOWN_KEYS:
                self._unknown.popitem(last=False)

    def lookup(self, key: str) -> tuple[Keyring, KeyRecord] | None:
        """The keyring and record of an API key, or None for an unknown key. The database is asked
        about an unknown key at most once per API_KEY_CACHE_SECONDS, and again after any invalidation."""
        with self._lock:
            user_id = self._owner.get(key)
            changes = self._changes
        if user_id is None:
            self._ensure_subscriber()  # sets how long remembered keys are trusted
            with self._lock:
                if self._known_unknown(key, time.monotonic()):
                    return None
                changes = self._changes
        ring = self.for_user(user_id) if user_id is not None else None
        record = ring.find(key) if ring is not None else None
        if record is None:  # unknown here: ask the database who owns it
            user_id = ApiKey.objects.filter(key=key).values_list("user_id", flat=True).first()
            if user_id is None:
                self._remember_unknown(key, changes)
                return None
            self._drop(user_id)  # a load of its own, not a change: unknown keys stay remembered
            ring = self.for_user(user_id)
            record = ring.find(key) if ring is not None else None
            if record is None:
                return None
        return ring, record

    def evict(self, user_id: int) -> None:
        """The account or one of its keys changed: forget its keyring and every unknown key (the
        change may have created one of them)."""
        with self._lock:
            self._changes += 1
            self._unknown.clear()
        self._drop(user_id)

    def _drop(self, user_id: int) -> None:
        with self._lock:
            self._generation[user_id] = self._generation.get(user_id, 0) + 1
            ring = self._keyrings.pop(user_id, None)
            if ring is not None:
                for record in ring.keys:
                    self._owner.pop(record.key, None)

    def clear(self) -> None:
        with self._lock:
            self._epoch += 1
            self._changes += 1
            self._generation.clear()
            self._keyrings.clear()
            self._owner.clear()
            self._unknown.clear()

    # --- cross-process invalidation ---------------------------------------------------------

    def invalidate(self, user_id: int) -> None:
        """Evict now (this process) and again after commit, everywhere. Without Redis the change's
        own transaction also appends it to the database's revocation log (other processes)."""
        self.evict(user_id)
        if not settings.REDIS_URL:
            log_revocation(user_id)
        transaction.on_commit(lambda: self._evict_everywhere(user_id))

    def _evict_everywhere(self, user_id: int) -> None:
        self.evict(user_id)
        if not settings.REDIS_URL:
            return
        try:  # the log first: it is what bounds the revocation when the message below is lost
            _log_client().eval(_LOG_APPEND, len(LOG_KEYS), *LOG_KEYS, user_id, uuid.uuid4().hex, LOG_LENGTH)
        except Exception:
            logger.exception("Could not append a keyring invalidation to the revocation log")
        try:
            _redis().publish(_channel(), str(user_id))
        except Exception:
            logger.exception("Could not publish a keyring invalidation")

    def sync(self) -> None:
        """Read the revocation log (Redis's, or the database's without Redis) from where this
        process left it and evict what it names."""
        started = time.monotonic()
        last = self._log_position[1] if self._log_position is not None else 0
        if settings.REDIS_URL:
            reply = _log_client().eval(_LOG_READ, len(LOG_KEYS), *LOG_KEYS, last, LOG_LENGTH)
            log_id, sequence = _text(reply[0]), int(reply[1])
            members = [int(_text(member).split(":", 1)[0]) for member in (reply[2] if len(reply) > 2 else [])]
        else:
            log_id = DATABASE_LOG_ID
            sequence, members = _read_database_log(last)
        if self._log_position is None or self._log_position[0] != log_id or sequence < last:
            self.clear()  # first read, or a new log (Redis lost its data): anything may have changed
        elif sequence > last and not members:
            self.clear()  # further behind than the log is long
        else:
            for account in set(members):
                self.evict(account)
        self._log_position = (log_id, sequence)
        self._trust_until = started + settings.API_KEY_REVOCATION_SECONDS
        self._synced.set()

    def revocations(self) -> tuple[str, int] | None:
        """Where this process's last read of the revocation log ended (log id, sequence): it moves
        when another process revoked something, at most API_KEY_REVOCATION_SECONDS / 4 after."""
        self._ensure_reader()
        return self._log_position

    def _read_log(self) -> None:
        interval = settings.API_KEY_REVOCATION_SECONDS / 4
        while True:
            started = time.monotonic()
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the cache is not trusted meanwhile (_fresh)
                LOG_OUTAGE.failed(exc)
            else:
                LOG_OUTAGE.ok()
            finally:  # as a request's end: the database log's reads leave no connection behind
                with contextlib.suppress(Exception):
                    close_old_connections()
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    def _ensure_reader(self) -> None:
        if self._log_reader is not None:
            return
        with self._lock:
            if self._log_reader is None:
                self._log_reader = threading.Thread(target=self._read_log, name="keyring-revocation-log", daemon=True)
                self._log_reader.start()
        # Cache nothing before the first read (bounded: until then, nothing cached is used).
        self._synced.wait(timeout=1.0)

    def _ensure_subscriber(self) -> None:
        """The log reader, and with Redis the pub/sub listener. Without Redis the log is the
        database's: other processes (`manage.py apikey disable`) reach this one through it alone."""
        if settings.REDIS_URL and self._subscriber is None:
            with self._lock:
                if self._subscriber is None:
                    self._subscriber = threading.Thread(target=self._listen, name="keyring-invalidation", daemon=True)
                    self._subscriber.start()
            # Cache nothing before we hear invalidations (bounded: without them, nothing cached is used).
            self._subscribed.wait(timeout=1.0)
        self._ensure_reader()

    def _listen(self) -> None:
        first = True
        while True:
            try:
                pubsub = _redis().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(_channel())
                if not first:  # whatever changed while we were not listening is unknown: start clean
                    self.clear()
                first = False
                LISTEN_OUTAGE.ok()
                self._subscribed.set()
                for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.evict(int(message["data"]))
            except Exception as exc:  # noqa: BLE001 - it retries every second; the Outage logs it
                LISTEN_OUTAGE.failed(exc)
                time.sleep(1)


_redis_client = None
_log_redis_client = None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _log_client():
    """The revocation log's own client, with short timeouts: a stuck read must not hold the reader
    (the cache stops being trusted API_KEY_REVOCATION_SECONDS after the last complete read)."""
    global _log_redis_client
    if _log_redis_client is None:
        _log_redis_client = redis_clients.client(socket_timeout=1, socket_connect_timeout=1)
    return _log_redis_client


def _channel() -> str:
    """The invalidation channel of this Redis database. Pub/sub ignores database numbers, so
    services (or test runs) sharing one Redis server in different databases would otherwise evict
    each other's accounts by id, and with them every remembered unknown key."""
    return f"{INVALIDATE_CHANNEL}:{_redis().connection_pool.connection_kwargs.get('db', 0)}"


def _redis():
    global _redis_client
    if _redis_client is None:
        _redis_client = redis_clients.client()
    return _redis_client


keyrings = KeyringCache()
