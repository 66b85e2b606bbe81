"""What the hub does when it falls behind: a message reaches it more than STREAM_MAX_LAG_SECONDS
after the relay sent it (more events than this process can write, while the channel layer queues
the rest, every account's alike). Both times are Redis's clock as each process estimates it
(streams/clock.py), so two app hosts whose own clocks differ do not make a hub look behind for ever
(or never).

Who pays. A connection's events cost the process one write each; an account's fan-out costs its
postings times its connections. The postings are not always the account's doing: anyone can send
an account money (a P2P transfer to its e-mail, a deposit to its address), as often as their own
limits allow. Closing the connections of the account with the costliest fan-out (what this did
before) let an outsider get a victim's streams closed by sending it many small transfers. So:

1. The connections that do not take their frames pay first. Behind for half the bound (not one
   pause's backlog drained at once), the hub closes (4006, too slow: reconnect and resync) every
   connection whose oldest frame not yet taken by its client has waited half the bound (or that
   holds half of STREAM_MAX_PENDING_FRAMES): they would be closed at the full bound by their own
   check anyway (streams/consumers.py `check_lag`), and meanwhile they hold the process's memory.
   A connection that takes its frames as they come is never closed by the hub for its account's
   volume.
2. If none is slow, an account pays for what it caused itself: the hub charges an account the
   writes of the postings that debited or held its money (its own orders, converts, withdrawals,
   transfers out: its own doing, or its operators'), never those that only credited it (money
   received). If one account's own postings made at least half of all the hub's writes over the
   last one to two seconds, its connections here are closed (4006): that removes at least half the
   work, and it caused it. A recipient flooded by others is never that account.
3. Otherwise nobody here caused it: the process is overloaded by volume (many accounts, or one
   that others send money to), the hub logs it and every connection waits alike; the answer is
   more websocket processes. What an outsider can send one account is bounded by the sender's own
   limits (its balance, its API rate limits and daily transfer limit), i.e. the sender pays.

The hub judges at most once per bound. `Fairness` is the meter: the hub charges it each dispatch's
writes and shows it each message's "sent"; it sees the connections through two callables."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Protocol

from django.conf import settings

from streams import clock as shared_clock


class Listener(Protocol):
    """A connection as the meter sees it (streams.hub.listeners.Listener)."""

    gone: bool

    def lag(self) -> tuple[float, int]: ...

    def too_slow(self) -> None: ...


logger = logging.getLogger(__package__)  # streams.hub

COST_WINDOW_SECONDS = 1.0
MAX_LAG_SECONDS = 1.0  # the setting's default (exchange/settings/base.py)
MAX_PENDING_FRAMES = 2000  # STREAM_MAX_PENDING_FRAMES's default (streams/consumers.py)


def max_lag_seconds() -> float:
    return getattr(settings, "STREAM_MAX_LAG_SECONDS", MAX_LAG_SECONDS)


def caused_by_holder(rows: list[dict]) -> bool:
    """Whether a posting's rows of one account are the account's own doing: it spent or held money
    (a debit of free, any change of locked). A posting that only credited it (a deposit, a transfer
    received, a master's transfer to it) was someone else's."""
    return any(Decimal(row["delta_free"]) < 0 or Decimal(row["delta_locked"]) != 0 for row in rows)


class Fairness:
    """The cost meter and the judge. `audience(account)` gives the connections that get the account's
    events, `everyone()` every connection started here; `clock` is monotonic seconds (how long the
    hub has been behind, the cost windows)."""

    def __init__(
        self,
        audience: Callable[[int], Iterable[Listener]],
        everyone: Callable[[], Iterable[Listener]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.audience = audience
        self.everyone = everyone
        self.clock = clock
        self._cost: dict[int, int] = {}  # account -> writes of postings it caused itself, this cost window
        self._cost_before: dict[int, int] = {}  # ... in the window before
        self._writes = 0  # all connection writes in this cost window
        self._writes_before = 0  # ... in the window before
        self._cost_since = clock()
        self._judged_at = -1e9  # when the hub last judged whom to close for being behind
        self._behind_since: float | None = None  # since when the messages arrive late
        self.late = 0  # messages received more than STREAM_MAX_LAG_SECONDS after they were sent
        self.sheds = 0  # times the hub was behind and closed connections

    def charge(self, account: int, writes: int, caused: int) -> None:
        """`writes` connection writes for the account's postings, `caused` of them for postings it
        caused itself."""
        now = self.clock()
        if now - self._cost_since >= COST_WINDOW_SECONDS:
            self._cost_before, self._cost, self._cost_since = self._cost, {}, now
            self._writes_before, self._writes = self._writes, 0
        self._writes += writes
        if caused:
            self._cost[account] = self._cost.get(account, 0) + caused

    def received(self, sent: float | None) -> None:
        """A message sent at `sent` (Redis's clock; None from an older relay) reached the hub: behind
        for a while, it closes who pays."""
        if sent is None:
            return
        behind = shared_clock.hub.now() - sent
        limit = max_lag_seconds()
        now = self.clock()
        if behind <= limit:
            self._behind_since = None
            return
        self.late += 1
        if self._behind_since is None:
            self._behind_since = now
        # Behind for a while, not a backlog of one stall (a pause of the process) drained at once.
        if now - self._behind_since < limit / 2 or now - self._judged_at < limit:
            return
        self._judged_at = now
        if not self._shed_slow(behind, limit) and not self._shed_cause(behind):
            logger.warning(
                "The stream hub is %.1f s behind, and no connection here is slow nor any account the cause: "
                "more events than this process can write (nobody closed)",
                behind,
            )

    def _shed_slow(self, behind: float, limit: float) -> bool:
        max_frames = getattr(settings, "STREAM_MAX_PENDING_FRAMES", MAX_PENDING_FRAMES)
        slow = []
        for listener in set(self.everyone()):
            if listener.gone:
                continue
            waited, waiting = listener.lag()
            if waited >= limit / 2 or waiting >= max_frames / 2:
                slow.append(listener)
        if not slow:
            return False
        self.sheds += 1
        logger.warning(
            "The stream hub is %.1f s behind: closing %s connections slow to take their frames (4006, the hub is "
            "behind)",
            behind,
            len(slow),
        )
        for listener in slow:
            listener.too_slow()
        return True

    def _shed_cause(self, behind: float) -> bool:
        totals = dict(self._cost_before)
        for account, writes in self._cost.items():
            totals[account] = totals.get(account, 0) + writes
        everything = self._writes + self._writes_before
        for account in sorted(totals, key=totals.__getitem__, reverse=True):
            if 2 * totals[account] < everything:
                return False  # nobody made half the work
            listeners = [listener for listener in self.audience(account) if not listener.gone]
            if not listeners:
                continue
            self.sheds += 1
            self._cost.pop(account, None)
            self._cost_before.pop(account, None)
            logger.warning(
                "The stream hub is %.1f s behind: closing the %s connections of account %s, whose own postings "
                "made %s of the last %s writes (4006, the hub is behind)",
                behind,
                len(listeners),
                account,
                totals[account],
                everything,
            )
            for listener in listeners:
                listener.too_slow()
            return True
        return False
