"""One account cannot hold the process's other accounts behind it: what the hub does when it falls
behind (a message reaches it more than STREAM_MAX_LAG_SECONDS after the relay sent it: more events
than this process can write, while the channel layer queues the rest, every account's alike).

The hub counts what each account's fan-out costs it (connection writes, over the last one to two
seconds). Once behind for half that bound (not a backlog of one pause drained at once), it closes
the connections here of the account that cost the most (4006: too slow, reconnect and resync, as
for a connection that cannot keep up), at most once per STREAM_MAX_LAG_SECONDS: the queued messages
of that account then cost nothing (nobody here listens), the hub catches up, and the other
accounts' events are on time again. A connection's own lag is bounded in streams/consumers.py
(`check_lag`)."""

from __future__ import annotations

import logging
import time

from django.conf import settings

logger = logging.getLogger(__package__)  # streams.hub

COST_WINDOW_SECONDS = 1.0
MAX_LAG_SECONDS = 1.0  # the setting's default (exchange/settings/base.py)


def max_lag_seconds() -> float:
    return getattr(settings, "STREAM_MAX_LAG_SECONDS", MAX_LAG_SECONDS)


class FairnessMixin:
    """The Hub's fairness side; `cost`, `cost_before`, `cost_since`, `shed_at`, `sheds` and
    `behind_since` are set up in Hub.__init__ (streams/hub/__init__.py)."""

    cost: dict[int, int]
    cost_before: dict[int, int]
    cost_since: float
    shed_at: float
    sheds: int
    behind_since: float | None

    def _charge(self, account: int, writes: int) -> None:
        now = time.monotonic()
        if now - self.cost_since >= COST_WINDOW_SECONDS:
            self.cost_before, self.cost, self.cost_since = self.cost, {}, now
        self.cost[account] = self.cost.get(account, 0) + writes

    def _check_behind(self, message: dict) -> None:
        sent = message.get("sent")
        if sent is None:
            return
        behind = time.time() - sent
        limit = max_lag_seconds()
        now = time.monotonic()
        if behind <= limit:
            self.behind_since = None
            return
        if self.behind_since is None:
            self.behind_since = now
        # Behind for a while, not a backlog of one stall (a pause of the process) drained at once.
        if now - self.behind_since < limit / 2 or now - self.shed_at < limit:
            return
        totals = dict(self.cost_before)
        for account, writes in self.cost.items():
            totals[account] = totals.get(account, 0) + writes
        listeners = []
        while totals and not listeners:
            account = max(totals, key=totals.__getitem__)
            listeners = [listener for listener in self._audience(account) if not listener.gone]
            del totals[account]
        if not listeners:
            return
        self.shed_at = now
        self.sheds += 1
        self.cost.pop(account, None)
        self.cost_before.pop(account, None)
        logger.warning(
            "The stream hub is %.1f s behind: closing the %s connections of account %s, the biggest fan-out "
            "here (4006, too slow)",
            behind,
            len(listeners),
            account,
        )
        for listener in listeners:
            listener.too_slow()
