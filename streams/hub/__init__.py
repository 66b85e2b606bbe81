"""The fan-out hub: one per server process (per event loop and channel layer) for all its websockets.

One channel-layer channel of the hub joins every group its connections need (each listened
account's `relay.account_group` and each listenKey's `key_group`, reference-counted), and one
receive loop dispatches what arrives. A message reaches the process once however many of its
connections listen to the account, and the hub does an account's work once:

- sequence: per account (a `Feed`) the last sequence dispatched and the rows that arrived ahead of
  it. Rows committed by several processes reach the hub out of order (each process publishes its
  own postings); rows ahead of the next expected sequence wait up to STREAM_GAP_WAIT_SECONDS for the
  missing ones, and only if those have not arrived then are they read from the database (one query
  for the account, whatever the number of connections). The same query catches an account up when
  the watcher sees its committed sequence beyond what was dispatched (a message the channel layer
  dropped). Duplicates (the sweeper resending, a row that came both ways) are dropped. Only what
  such a read covered is ever skipped: rows that arrive during it, beyond it, wait again.
- frames: each posting's events are built and serialised once per view (the account's own, and a
  whitelisted master's with `em`/`BI`) and the same JSON text goes to every connection
  (`Posting.frames`). A connection's outbox is its own (consumers.py).
- start: a connection registers before it reads its accounts' sequences (events up to them are
  history, as before); what the hub dispatched meanwhile beyond that sequence is replayed to it
  from the feed's recent postings (`Feed.history`), or read from the database when they no longer
  reach back that far. Each connection remembers the last sequence it was given per account, so it
  never gets a posting twice, whichever way (own key, a master's view, a replay) it came.
- listenKey closes (`listenkey.closed`) arrive on the same channel, in order with the account's
  events: the hub detaches the key from its connections before it looks at the next message, so an
  event sent after a key was closed never reaches a connection through that key.

The hub is one class put together from one module per concern:

- channel.py: the channel, its group memberships, the receive loop, background tasks;
- ordering.py: per-account order (`Feed`), gap wait and gap fill;
- frames.py: a posting's frames, built once per view;
- accounts.py: what the hub knows of accounts and who listens to them;
- listeners.py: the listener registry and the delivery to connections;
- fairness.py: behind, it closes the connections slow to take their frames, else those of an account
  whose own postings made most of its work; never a recipient's for what others send it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref

from streams.hub.accounts import INFO_SECONDS, AccountInfo, AccountsMixin, Read, read_accounts
from streams.hub.channel import ChannelMixin, cancelling
from streams.hub.fairness import FairnessMixin
from streams.hub.frames import Posting, postings_of
from streams.hub.listeners import Listener, ListenersMixin
from streams.hub.ordering import Feed, OrderingMixin

__all__ = [
    "AccountInfo",
    "Feed",
    "Hub",
    "Listener",
    "Posting",
    "Read",
    "cancelling",
    "hub_for",
    "hubs",
    "postings_of",
    "read_accounts",
]


class Hub(ListenersMixin, OrderingMixin, AccountsMixin, FairnessMixin, ChannelMixin):
    def __init__(self, layer, loop: asyncio.AbstractEventLoop) -> None:
        self.layer = layer
        self.loop = loop
        self.channel: str | None = None
        self.refs: dict[str, int] = {}  # group -> registrations that need it
        self.members: set[str] = set()  # groups the channel is in
        self.reconciling: dict[str, asyncio.Task] = {}
        self.key_listeners: dict[str, set[Listener]] = {}
        self.interest: dict[int, int] = {}  # account -> listeners that own it (started or not)
        self.own_listeners: dict[int, set[Listener]] = {}  # account -> listeners started on it
        self.feeds: dict[int, Feed] = {}
        self.info: dict[int, AccountInfo] = {}
        self.subs_of: dict[int, set[int]] = {}  # master -> sub-accounts the hub knows
        self.stale: set[int] = set()  # accounts whose info is being read again
        self.receiver: asyncio.Task | None = None
        self.refresher: asyncio.Task | None = None
        self.refreshed_at = time.monotonic()  # group memberships last renewed
        self.tasks: set[asyncio.Task] = set()
        self.cost: dict[int, int] = {}  # account -> writes of postings it caused itself, this cost window
        self.cost_before: dict[int, int] = {}  # ... in the window before
        self.writes = 0  # all connection writes in this cost window
        self.writes_before = 0  # ... in the window before
        self.cost_since = time.monotonic()
        self.judged_at = -1e9  # when the hub last judged whom to close for being behind
        self.behind_since: float | None = None  # since when the messages arrive late
        # Counters (tests, diagnostics).
        self.messages = 0  # ledger messages received
        self.waits = 0  # times rows arrived ahead of a missing sequence and the hub waited for it
        self.fills = 0  # feed gap fills and catch-ups read from the database
        self.replays = 0  # connections started from the database (their start beyond the history)
        self.late = 0  # messages received more than STREAM_MAX_LAG_SECONDS after they were sent
        self.sheds = 0  # times the hub was behind and closed connections (fairness.py)

    def maintain(self) -> None:
        """The watcher's periodic upkeep: rejoin the groups now and then, forget accounts nobody
        here has listened to for a while."""
        now = time.monotonic()
        if now - self.refreshed_at > min(3600.0, getattr(self.layer, "group_expiry", 86400) / 4):
            self.refreshed_at = now
            self._spawn(self._refresh_groups())
        masters = {info.master for info in self.info.values() if info.master is not None}
        for account in [
            account
            for account, info in self.info.items()
            if info.expires < now - INFO_SECONDS
            and account not in self.feeds
            and account not in self.interest
            and account not in masters
        ]:
            del self.info[account]
        for master in [master for master, subs in self.subs_of.items() if not subs & self.info.keys()]:
            del self.subs_of[master]


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Hub]] = weakref.WeakKeyDictionary()


def hub_for(layer) -> Hub:
    """This event loop's hub for `layer` (the server's: one per process)."""
    loop = asyncio.get_running_loop()
    hubs = _hubs.setdefault(loop, {})
    hub = hubs.get(id(layer))
    if hub is None or hub.layer is not layer:
        hub = hubs[id(layer)] = Hub(layer, loop)
    return hub


def hubs() -> list[Hub]:
    with contextlib.suppress(RuntimeError):
        return list(_hubs.get(asyncio.get_running_loop(), {}).values())
    return []
