"""The one way a process caches reference data and still sees every change within a stated bound
(ReferenceCache, below): read on every request of a hot path, changed rarely by staff. Every such
cache uses it: convert's enabled pairs with their assets and markets, the business status, assets
by code, transfer fees and limit tiers. The API keyring (accounts/keyring.py) keeps its own
revocation log, for the reasons docs/architecture.md's table of caches gives (per-account eviction,
keys change often). That table lists each cache, what invalidates it and its bound."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction

from exchange.runtime.outage import Outage

logger = logging.getLogger(__name__)
VERSION_OUTAGE = Outage(
    logger, "Cannot read the reference data version; reference data comes from the database", settle=0.0
)


# --- reference data invalidated everywhere -------------------------------------------------------
# Rows read on every request of a hot path (convert's pairs with their assets and markets, the
# business status, assets by code, transfer fees, limit tiers): cached per process and invalidated
# so that a change is seen by every process within a stated bound:
#
# - a change (a save or delete of a cached model, or a queryset update of one; signals and managers
#   in the owning apps) clears every ReferenceCache of this process at once and, after commit, again,
#   and then writes a new random value under REFERENCE_VERSION_KEY in Redis;
# - a thread of every process reads that key every REFERENCE_REVOCATION_SECONDS / 4 (one GET, off
#   the request path) and clears its caches when the value differs from the last one it read (a
#   Redis that lost its data reads as a new value too); a process trusts its cached values only
#   while its last complete read started less than REFERENCE_REVOCATION_SECONDS (1) ago, else it
#   loads from the database: a change reaches every process within that bound;
# - every value also expires REFERENCE_CACHE_SECONDS (10) after its load: the bound for what the
#   version cannot cover (a process that dies between its commit and its after-commit step);
# - a load made inside a transaction is used but not kept: it may see the transaction's own
#   uncommitted change, which a rollback would leave cached (as accounts/ledger/system.py does);
# - without Redis (the embedded mode: one process) every change clears here at once, and cached
#   values are trusted until they expire.
# A load that overlapped a clear may hold pre-change rows: it serves its own request and is not kept.

REFERENCE_VERSION_KEY = "exchange:reference:version"
_reference_caches: list[ReferenceCache] = []


class _VersionWatcher:
    """The process's reader of REFERENCE_VERSION_KEY (one thread for every ReferenceCache)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._synced = threading.Event()
        self._version: bytes | None = None
        self._read_once = False
        # Cached values are used until then (a float: the request path reads no setting).
        self.trust_until = -math.inf

    def ensure_reader(self) -> None:
        if not settings.REDIS_URL:
            self.trust_until = math.inf  # one process: every change clears here at once
            return
        if self.trust_until == math.inf:  # Redis configured since (tests): trust the reads again
            self.trust_until = -math.inf
        if self._reader is not None:
            return
        with self._lock:
            if self._reader is None:
                self._reader = threading.Thread(target=self._read_loop, name="reference-version", daemon=True)
                self._reader.start()
        self._synced.wait(timeout=1.0)  # bounded: until a read completes, nothing cached is used

    def sync(self) -> None:
        """Read the version once; clear every reference cache when it changed (or on the first read:
        anything may have changed before this process listened)."""
        started = time.monotonic()
        version = _version_client().get(REFERENCE_VERSION_KEY)
        if not self._read_once or version != self._version:
            clear_references()
        self._version, self._read_once = version, True
        self.trust_until = started + settings.REFERENCE_REVOCATION_SECONDS
        self._synced.set()

    def _read_loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the caches are not trusted meanwhile
                VERSION_OUTAGE.failed(exc)
            else:
                VERSION_OUTAGE.ok()
            interval = settings.REFERENCE_REVOCATION_SECONDS / 4
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


class ReferenceCache:
    """Values loaded by `get(key, load)`, kept per process under the rules above."""

    def __init__(self, name: str, watcher: _VersionWatcher | None = None) -> None:
        self.name = name
        self._watcher = watcher or versions
        self._lock = threading.Lock()
        self._data: dict[Hashable, tuple[float, Any]] = {}
        self._generation = 0
        _reference_caches.append(self)

    def get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        watcher = self._watcher
        watcher.ensure_reader()
        now = time.monotonic()
        hit = self._data.get(key)
        if hit is not None and hit[0] > now and now < watcher.trust_until:
            return hit[1]
        generation = self._generation
        value = load()
        if connection.in_atomic_block:
            return value
        with self._lock:
            if generation == self._generation:
                self._data[key] = (now + settings.REFERENCE_CACHE_SECONDS, value)
        return value

    def clear(self, *_args, **_kwargs) -> None:
        with self._lock:
            self._generation += 1
            self._data.clear()


def clear_references() -> None:
    for cache in _reference_caches:
        cache.clear()


def clear_all(*_args, **_kwargs) -> None:
    """Every cache of this process, now (tests: after a rolled-back test, or a write made behind
    the caches' back)."""
    clear_references()


def invalidate_references(*_args, **_kwargs) -> None:
    """A cached reference model changed (a signal handler, or a manager's update): clear this
    process's caches now, and after commit again and in every process."""
    clear_references()
    transaction.on_commit(_invalidate_everywhere)


def _invalidate_everywhere() -> None:
    clear_references()
    if not settings.REDIS_URL:
        return
    try:
        _version_client().set(REFERENCE_VERSION_KEY, uuid.uuid4().hex)
    except Exception:
        logger.exception(
            "Could not publish a reference data change; other processes see it within %s s",
            settings.REFERENCE_CACHE_SECONDS,
        )


class ReferenceQuerySet(models.QuerySet):
    """The manager of a cached reference model: bulk writes (which send no signals) invalidate too."""

    def update(self, **kwargs):
        invalidate_references()
        return super().update(**kwargs)

    def delete(self):
        invalidate_references()
        return super().delete()

    def bulk_update(self, objs, fields, batch_size=None):
        invalidate_references()
        return super().bulk_update(objs, fields, batch_size=batch_size)

    def bulk_create(self, objs, *args, **kwargs):
        invalidate_references()
        return super().bulk_create(objs, *args, **kwargs)


_version_redis_client = None


def _version_client():
    """Short timeouts: a stuck read must not hold the reader (the caches stop being trusted
    REFERENCE_REVOCATION_SECONDS after the last complete read)."""
    global _version_redis_client
    if _version_redis_client is None:
        from exchange.runtime import redis_clients

        _version_redis_client = redis_clients.client(socket_timeout=1, socket_connect_timeout=1)
    return _version_redis_client


versions = _VersionWatcher()
