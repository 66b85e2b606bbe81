"""Logging a dependency's outage the way an operator wants to read it.

While Redis or PostgreSQL is away, every request that needs it fails the same way: a traceback per
request (hundreds a second under load) buries the one line that says when it started and when it
ended. An `Outage` logs the first failure with its traceback, then at most one line every `every`
seconds with how many more failures there were, and one line when the dependency works again
(`ok()`, where the code sees a success; where it does not, an outage ends after `every` seconds
without a failure, and the next failure starts a new one). Per process; thread-safe; `ok()` on the
hot path is one attribute read while nothing is failing.
"""

from __future__ import annotations

import functools
import logging
import threading
import time


class WithoutServiceUnavailable(logging.Filter):
    """For django.request, which logs every 5xx answer: a 503 is one of our refusals while a
    dependency is away (-1001, -1126), whose cause an `Outage` already logs, once per outage."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "status_code", None) != 503


class Outage:
    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        every: float = 10.0,
        level: int = logging.ERROR,
        traceback: bool = True,
        settle: float = 1.0,
    ) -> None:
        self.logger = logger
        self.what = what  # e.g. "Rate-limit storage unavailable; requests not counted"
        self.every = every
        self.level = level
        self.traceback = traceback  # False: the first failure's line names the error instead
        self.settle = settle  # ok() ends an outage only this long after its last failure (mixed answers)
        self.down = False
        self._lock = threading.Lock()
        self._since = 0.0
        self._reported = 0.0
        self._last = 0.0
        self._unreported = 0
        self._total = 0

    def failed(self, exc: BaseException | None = None) -> None:
        """One more failure. The first of an outage is logged with `exc`'s traceback; the following
        ones are counted and summed up in one line every `every` seconds. An error that is not a
        dependency being away (a defect) is logged whole, every time, and not counted."""
        if exc is not None and not isinstance(exc, dependency_errors()):
            self.logger.log(self.level, "%s (not an outage)", self.what, exc_info=exc)
            return
        now = time.monotonic()
        with self._lock:
            quiet = self.down and now - self._last >= self.every
            if quiet:  # nothing failed for a while and nobody said it works: that outage has ended
                self.down = False
                ended = (self._last - self._since, self._total, self._unreported)
            last, self._last = self._last, now
            if not self.down:
                self.down = True
                self._since = self._reported = now
                self._unreported, self._total = 0, 1
                first = True
            else:
                self._total += 1
                self._unreported += 1
                first = False
                if now - self._reported < self.every:
                    return
                count, self._unreported, self._reported = self._unreported, 0, now
            since = self._since
        if first:
            if quiet:
                lasted, total, unreported = ended
                self.logger.log(
                    self.level,
                    "%s - the previous outage ended %.0f s ago (it lasted %.1f s, %d failure(s), %d not logged)",
                    self.what,
                    now - last,
                    lasted,
                    total,
                    unreported,
                )
            if self.traceback:
                self.logger.log(self.level, "%s", self.what, exc_info=exc)
            else:
                self.logger.log(self.level, "%s%s", self.what, _cause(exc))
        else:
            self.logger.log(
                self.level,
                "%s - still failing after %.0f s (%d more since the last line)%s",
                self.what,
                now - since,
                count,
                _cause(exc),
            )

    def ok(self) -> None:
        """The dependency answered: if an outage was being logged, one line that it is over."""
        if not self.down:
            return
        now = time.monotonic()
        with self._lock:
            if not self.down or now - self._last < self.settle:
                return  # some requests still fail (e.g. a pool at its limit): the outage goes on
            self.down = False
            lasted, total = now - self._since, self._total
        self.logger.warning("%s - over: back after %.1f s, %d failure(s) in all", self.what, lasted, total)


def _cause(exc: BaseException | None) -> str:
    return f": {type(exc).__name__}: {str(exc).strip()[:300]}" if exc is not None else ""


@functools.cache
def dependency_errors() -> tuple[type[BaseException], ...]:
    """What a dependency being away raises: the database's operational and interface errors
    (Django's and psycopg's own), Redis's connection, timeout, loading and read-only (a failover)
    errors, and a socket's connection errors and timeouts."""
    import psycopg
    from django import db
    from redis import exceptions as redis

    return (
        db.OperationalError,
        db.InterfaceError,
        psycopg.OperationalError,
        redis.ConnectionError,
        redis.TimeoutError,
        redis.BusyLoadingError,
        redis.ReadOnlyError,
        ConnectionError,  # the built-in ones (sockets): refused, reset, broken pipe
        TimeoutError,
    )


def periodic(name: str):
    """For a periodic job (a beat task) whose next tick does the same work again: while the database
    or Redis is away it logs through an `Outage` (once, then every 10 s, then when it runs again)
    and returns None, instead of a traceback from Celery at every tick. Any other error still raises."""
    outage = Outage(
        logging.getLogger("exchange.periodic"),
        f"Periodic job {name} could not reach the database or Redis; the next tick runs it again",
        level=logging.WARNING,
        traceback=False,
    )

    def wrap(job):
        @functools.wraps(job)
        def run(*args, **kwargs):
            try:
                result = job(*args, **kwargs)
            except dependency_errors() as exc:
                outage.failed(exc)
                return None
            outage.ok()
            return result

        return run

    return wrap
