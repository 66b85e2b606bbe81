"""Waiting on a condition instead of the clock. A test waits for what it expects with a generous
deadline (a slow, shared machine only makes it wait longer, never fail), and where a time bound is
the feature (a revocation within a second, a close at the TTL) it asserts on when the thing
happened (the moment the server sent the close, or a cache evicted), not on when the test got round
to looking.

    seen = wait_until(lambda: not cache.cached(key))       # the monotonic time it was first seen
    ws, sent = recorded_communicator(key)                    # every frame the server sent, timed
    closed = await sent.first(KEY_DEAD)                      # the time the close was sent
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# Long enough for any honest wait on a loaded 2-core machine; only a broken feature reaches it.
DEADLINE_SECONDS = 15.0


def wait_until(predicate: Callable[[], object], *, timeout: float = DEADLINE_SECONDS, what: str = "") -> float:
    """Poll `predicate` until it is true; the monotonic time it was first seen true. Fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        assert time.monotonic() < deadline, f"not within {timeout} s: {what or predicate}"
        time.sleep(0.01)


async def until(predicate: Callable[[], object], *, timeout: float = DEADLINE_SECONDS, what: str = "") -> float:
    """`wait_until` for async tests (the event loop runs meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        assert time.monotonic() < deadline, f"not within {timeout} s: {what or predicate}"
        await asyncio.sleep(0.01)


class Sent(list):
    """(monotonic time, message) of every ASGI message the application sent, in order."""

    async def first(self, message: dict, *, timeout: float = DEADLINE_SECONDS) -> float:
        """When `message` was first sent (waits for it)."""
        await until(lambda: any(m == message for _, m in self), timeout=timeout, what=f"sent {message}")
        return next(at for at, m in self if m == message)

    def count(self, message: dict) -> int:  # type: ignore[override]
        return sum(1 for _, m in self if m == message)


def recording(application, sent: Sent):
    """`application` with every message it sends recorded in `sent` with the time it was sent."""

    async def recorded(scope, receive, send):
        async def send_and_record(message):
            sent.append((time.monotonic(), message))
            await send(message)

        return await application(scope, receive, send_and_record)

    return recorded


class CallCounter:
    """Wraps a function: counts its calls, and waits until it was called `n` more times."""

    def __init__(self, function: Callable) -> None:
        self.function = function
        self.calls: list[float] = []

    def __call__(self, *args, **kwargs):
        self.calls.append(time.monotonic())
        return self.function(*args, **kwargs)

    async def more(self, n: int, *, timeout: float = DEADLINE_SECONDS) -> None:
        target = len(self.calls) + n
        await until(lambda: len(self.calls) >= target, timeout=timeout, what=f"{n} more calls of {self.function}")
