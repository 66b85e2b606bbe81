"""Per-account sequence order (`Ordering`): a `Feed` per account (last sequence dispatched, rows that
arrived ahead, recent postings), the wait for a missing sequence and the gap fill from the database."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine

from channels.db import database_sync_to_async
from django.conf import settings

from streams import relay
from streams.hub.channel import RETRY_SECONDS, cancelling
from streams.hub.frames import Posting, postings_of

logger = logging.getLogger(__package__)  # streams.hub, as before the split

# Default of the setting (exchange/settings/base.py, docs/streams.md), for settings modules without it.
GAP_WAIT_SECONDS = 0.2
# Recent postings kept per account to start a new connection where it should without a query: at
# most this many, dispatched within HISTORY_SECONDS (registering, reading and starting take ms).
HISTORY_POSTINGS = 256
HISTORY_SECONDS = 5.0


def gap_wait_seconds() -> float:
    return getattr(settings, "STREAM_GAP_WAIT_SECONDS", GAP_WAIT_SECONDS)


async def read_rows(account: int, first: int, upto: int) -> list[dict]:
    """The account's rows first..upto from the change feed (a gap fill, a catch-up, a replay)."""
    return await database_sync_to_async(relay.rows_between)(account, first, upto)


class Feed:
    """One account's events in this process, in sequence order."""

    def __init__(self, account: int, now: float) -> None:
        self.account = account
        self.last: int | None = None  # the last sequence dispatched; None until the feed starts
        self.anchor: int | None = None  # where it started
        self.ahead: dict[int, dict] = {}  # rows that arrived beyond last + 1, by sequence
        self.behind_to = 0  # the account's sequence as the watcher last saw it committed
        self.history: deque[Posting] = deque(maxlen=HISTORY_POSTINGS)
        self.progress_at = now  # when the feed last moved on (or started waiting)
        self.first_arrival: float | None = None
        self.email: str | None = None  # from the relay's messages
        self.timer: asyncio.TimerHandle | None = None
        self.filling: asyncio.Task | None = None
        self.resolving = False  # first heard of in a message: finding out who listens
        self.discovered = False  # started by the hub itself (a sub-account nobody here had read)

    def behind(self) -> bool:
        return self.last is not None and (bool(self.ahead) or self.behind_to > self.last)

    def remember(self, posting: Posting) -> None:
        history = self.history
        history.append(posting)
        while history and history[0].at < posting.at - HISTORY_SECONDS:
            history.popleft()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.filling is not None:
            self.filling.cancel()
            self.filling = None


class Ordering:
    """The feeds. Rows in sequence order, as postings (remembered in the feed's history), go to
    `dispatch(feed, postings)`; `spawn` runs a gap fill in the
    background; `read(account, first, upto)` reads rows (default: the change feed); `clock` is
    monotonic seconds (the gap wait is timed on the loop's own clock, `loop.call_later`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine], asyncio.Task],
        dispatch: Callable[[Feed, list[Posting]], None],
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[int, int, int], Awaitable[list[dict]]] | None = None,
    ) -> None:
        self.loop = loop
        self.spawn = spawn
        self.dispatch = dispatch
        self.clock = clock
        self.read = read
        self.feeds: dict[int, Feed] = {}
        self.waits = 0  # times rows arrived ahead of a missing sequence and the hub waited for it
        self.fills = 0  # gap fills and catch-ups read from the database

    # --- feeds -----------------------------------------------------------------------------------

    def get(self, account: int) -> Feed | None:
        return self.feeds.get(account)

    def feed(self, account: int) -> Feed:
        """The account's feed, made if need be (it holds the rows until it starts)."""
        feed = self.feeds.get(account)
        if feed is None:
            feed = self.feeds[account] = Feed(account, self.clock())
        return feed

    def drop(self, account: int) -> None:
        feed = self.feeds.pop(account, None)
        if feed is not None:
            feed.stop()

    def stop(self) -> None:
        for feed in self.feeds.values():
            feed.stop()
        self.feeds.clear()

    async def rows(self, account: int, first: int, upto: int) -> list[dict]:
        """The account's rows first..upto, read (a connection's replay reads them here too)."""
        return await (self.read or read_rows)(account, first, upto)

    def followed(self) -> list[int]:
        """The accounts whose feeds have started (for the watcher's catch-up)."""
        return [account for account, feed in self.feeds.items() if feed.last is not None]

    def begin(self, feed: Feed, start: int) -> None:
        """The feed starts after `start`: rows up to it are history."""
        feed.last = feed.anchor = start
        for seq in [seq for seq in feed.ahead if seq <= start]:
            del feed.ahead[seq]
        feed.progress_at = self.clock()
        self._advance(feed)

    def add(self, feed: Feed, rows: list[dict], email: str | None = None) -> None:
        """Rows of the feed's account arrived (in any order, duplicates dropped)."""
        if email:
            feed.email = email
        last = feed.last
        for row in rows:
            seq = row["seq"]
            if last is None or seq > last:
                feed.ahead.setdefault(seq, row)
        if feed.first_arrival is None:
            feed.first_arrival = self.clock()
        self._advance(feed)

    def catch_up(self, seqs: dict[int, int]) -> None:
        """The watcher read the accounts' committed sequences: a feed behind them waits
        STREAM_GAP_WAIT_SECONDS for the rows in flight, then reads the rest."""
        for account, seq in seqs.items():
            feed = self.feeds.get(account)
            if feed is not None and feed.last is not None and seq > max(feed.last, feed.behind_to):
                feed.behind_to = seq
                if feed.timer is None and feed.filling is None:
                    feed.progress_at = self.clock()  # rows in flight: give them the gap's wait
                self._advance(feed)

    # --- order -----------------------------------------------------------------------------------

    def _advance(self, feed: Feed) -> None:
        """Dispatch what follows the last sequence; wait for (or read) what is missing."""
        if feed.last is None:
            return
        run, seq = [], feed.last + 1
        while seq in feed.ahead:
            run.append(feed.ahead.pop(seq))
            seq += 1
        if run:
            feed.progress_at = self.clock()
            postings = postings_of(run)
            for posting in postings:
                feed.last = posting.last
                feed.remember(posting)
            self.dispatch(feed, postings)
        if feed.behind():
            if feed.timer is None and feed.filling is None:
                self.waits += 1
                wait = max(0.0, feed.progress_at + gap_wait_seconds() - self.clock())
                feed.timer = self.loop.call_later(wait, self._gap_due, feed)
        elif feed.timer is not None:
            feed.timer.cancel()
            feed.timer = None

    def _gap_due(self, feed: Feed) -> None:
        feed.timer = None
        if self.feeds.get(feed.account) is not feed or feed.filling is not None or not feed.behind():
            return
        due = feed.progress_at + gap_wait_seconds()
        if self.clock() < due:  # it moved on meanwhile: wait for the rest from then
            feed.timer = self.loop.call_later(due - self.clock(), self._gap_due, feed)
            return
        feed.filling = self.spawn(self._fill(feed))

    async def _fill(self, feed: Feed) -> None:
        """A real gap (or the watcher's catch-up): read the missing rows, once for the account."""
        first = feed.last + 1
        upto = max(max(feed.ahead, default=0), feed.behind_to)
        try:
            rows = await self.rows(feed.account, first, upto)
        except asyncio.CancelledError:
            raise
        except Exception:
            if cancelling():
                raise
            logger.exception("Could not read account %s's rows %s-%s; retrying", feed.account, first, upto)
            feed.filling = None
            feed.progress_at = self.clock() + RETRY_SECONDS - gap_wait_seconds()
            self._advance(feed)
            return
        feed.filling = None
        if self.feeds.get(feed.account) is not feed:
            return
        self.fills += 1
        for row in rows:
            if row["seq"] > feed.last:
                feed.ahead[row["seq"]] = row
        missing = feed.last + 1
        if missing <= upto and missing not in feed.ahead:
            # Not in the database either (it cannot be: sequences have no holes): skip what the read
            # covered rather than read it again and again. Only that: rows beyond `upto` that
            # arrived during the read may have a sequence still on its way from another publisher
            # before them; skipping to them would lose it for every connection of the process.
            resume = min([seq for seq in feed.ahead if seq > missing] + [upto + 1])
            logger.error("Account %s's rows %s-%s are missing from the change feed", feed.account, missing, resume - 1)
            feed.last = resume - 1
        if feed.behind_to <= upto:
            feed.behind_to = 0  # read up to it: what is there was found (the watcher looks again)
        feed.progress_at = self.clock()
        self._advance(feed)
