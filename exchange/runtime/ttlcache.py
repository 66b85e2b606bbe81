"""A small per-process cache for reference data read on every money movement (assets, fees, limit
tiers). Entries live `seconds`; saves in this process clear the cache at once (signals in the apps'
ready()), other processes see a change within `seconds`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

_all: list[TtlCache] = []


class TtlCache:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._data: dict[Hashable, tuple[float, Any]] = {}
        _all.append(self)

    def get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._data.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = load()
        with self._lock:
            self._data[key] = (now + self.seconds, value)
        return value

    def clear(self, *_args, **_kwargs) -> None:
        with self._lock:
            self._data.clear()


def clear_all(*_args, **_kwargs) -> None:
    for cache in _all:
        cache.clear()
