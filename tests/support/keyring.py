"""A keyring cache watched from a test (tests/accounts/test_keyring_log.py with Redis,
tests/accounts/test_keyring_database_log.py without): warmed until it trusts a key, and the moments
it evicts accounts."""

from __future__ import annotations

import time

from accounts.keyring import KeyringCache
from tests.support.waiting import wait_until


def warm(cache: KeyringCache, key: str) -> None:
    """Until `cache` answers `key` from its cache (its log reader's first read may follow the load)."""

    def trusted() -> bool:
        cache.lookup(key)
        return cache.cached(key)

    wait_until(trusted, what="the cache to trust the key")


def record_evictions(cache: KeyringCache) -> list[tuple[float, int]]:
    """(monotonic time, account) of each eviction `cache` makes from now on (its log reader's, its
    listener's), recorded once done: the moment it stops answering for that account from its cache."""
    done: list[tuple[float, int]] = []
    evict = cache.evict

    def recorded(user_id: int) -> None:
        evict(user_id)
        done.append((time.monotonic(), user_id))

    cache.evict = recorded
    return done
