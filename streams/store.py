"""Where listenKeys live: Redis keys with a TTL in the full stack (`streams:lk:<key>` -> account id,
`streams:active:<account>` -> key), a dict in process memory in the embedded default (one server
process holds the websockets there)."""

from __future__ import annotations

import threading
import time
from functools import lru_cache

from django.conf import settings


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[int, float]] = {}
        self._active: dict[int, str] = {}

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
            return account

    def ttl(self, key: str) -> float | None:
        with self._lock:
            entry = self._keys.get(key)
            return None if entry is None else max(0.0, entry[1] - time.time())


class RedisStore:
    PREFIX = "streams:lk:"
    ACTIVE = "streams:active:"

    def __init__(self, url: str) -> None:
        import redis

        self.redis = redis.Redis.from_url(url, decode_responses=True)

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
        return account

    def ttl(self, key: str) -> float | None:
        millis = self.redis.pttl(self.PREFIX + key)
        return None if millis < 0 else millis / 1000


@lru_cache(maxsize=4)
def _store_for(url: str):
    return RedisStore(url) if url else MemoryStore()


def store():
    return _store_for(settings.REDIS_URL)
