"""One clock for "how late is this message": Redis's (TIME), as each process estimates it.

The relay stamps each `ledger.changes` message with when it was sent, and a hub in another process
(another app host) tells how late it received it (streams/hub/fairness.py). Two hosts' own clocks
may differ by more than the lag bound (1 s): compared directly, a hub on a host whose clock is
ahead of the publisher's looked behind for ever, and one whose clock is behind never looked late.
So both sides read Redis's clock, which every process of the stack reaches: each keeps its own
clock's offset from Redis's, measured with one TIME call (the offset to the middle of the round
trip: its error is at most half the round trip, well under a millisecond on one network) and
measured again every REFRESH_SECONDS, so a clock that drifts or is stepped is followed within that.
The embedded default has one host and no Redis: its store answers with the local clock (offset 0).

The publisher's side measures in its own thread (`now_synced`: the relay's publisher thread and the
sweeper's thread hop); the hub's side is measured by the process's watcher in its thread hop
(`sync`), never on the event loop. A clock that cannot reach Redis keeps its last offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 10.0


class SharedClock:
    """This process's estimate of Redis's clock. `local` is the clock it corrects (the wall
    clock; a test gives a publisher's a skew)."""

    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self.local = local
        self.offset = 0.0  # Redis's clock minus the local one
        self.synced_at: float | None = None  # monotonic
        self._lock = threading.Lock()

    def now(self) -> float:
        """Redis's time now, as estimated here (no I/O)."""
        return self.local() + self.offset

    def due(self) -> bool:
        return self.synced_at is None or time.monotonic() - self.synced_at >= REFRESH_SECONDS

    def sync(self, server_time: Callable[[], float] | None = None) -> None:
        """Measure the offset again (one round trip to Redis). Blocking: call it off the event loop."""
        if server_time is None:
            from streams.store import store  # the store reads settings

            server_time = store().server_time
        with self._lock:
            try:
                before = self.local()
                server = server_time()
                after = self.local()
            except Exception:  # an unreachable Redis: keep the last offset, try later
                logger.debug("Could not read Redis's clock", exc_info=True)
                self.synced_at = time.monotonic()
                return
            self.offset = server - (before + after) / 2
            self.synced_at = time.monotonic()

    def sync_if_due(self) -> None:
        if self.due():
            self.sync()

    def now_synced(self) -> float:
        """`now()`, measuring the offset first when it is due (blocking: off the event loop)."""
        self.sync_if_due()
        return self.now()


# The relay's side (streams/relay/feed.py stamps messages with it) and the hubs' side
# (streams/hub/fairness.py reads it; streams/watcher.py keeps it measured). Two objects of one
# process, so that a test can give the publisher's clock a skew without touching the hub.
publisher = SharedClock()
hub = SharedClock()
