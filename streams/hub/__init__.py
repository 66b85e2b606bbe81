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

The hub is a small object composed of collaborators, each made with what it needs (the others'
public methods, a `clock`) and testable alone:

- `Channel` (channel.py): the channel-layer channel, its reference-counted group memberships and
  their renewal, the receive loop (each message to `Hub.receive`), the background tasks;
- `Ordering` (ordering.py): per-account order (`Feed`), the gap wait and the gap fill, each run of
  rows in order handed to the registry's `dispatch`;
- `Accounts` (accounts.py): what the hub knows of accounts (master, whitelisted, e-mail), how many
  connections own each, a sub-account discovered from a message, the periodic re-read;
- `Listeners` (listeners.py): the listener registry (connections by listenKey and by account) and
  the delivery to them, from the feed's history or a database replay;
- `Fairness` (fairness.py): the cost meter and the judge: behind, it closes the connections slow to
  take their frames, else those of an account whose own postings made most of its work; never a
  recipient's for what others send it;
- frames.py: a posting's frames, built once per view.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable

from streams.hub.accounts import AccountInfo, Accounts, Read, read_accounts
from streams.hub.channel import Channel, cancelling
from streams.hub.fairness import Fairness
from streams.hub.frames import Posting, postings_of
from streams.hub.listeners import Listener, Listeners
from streams.hub.ordering import Feed, Ordering

__all__ = [
    "AccountInfo",
    "Accounts",
    "Channel",
    "Fairness",
    "Feed",
    "Hub",
    "Listener",
    "Listeners",
    "Ordering",
    "Posting",
    "Read",
    "cancelling",
    "hub_for",
    "hubs",
    "postings_of",
    "read_accounts",
]


class Hub:
    """One process's (one loop's, one channel layer's) hub: the collaborators, wired together. The
    connections call `add_keys`, `joined`, `start`, `drop_key`, `drop_all`, `settle`; the watcher
    `followed`, `catch_up`, `maintain`; the channel `receive` with each message."""

    def __init__(self, layer, loop: asyncio.AbstractEventLoop, clock: Callable[[], float] = time.monotonic) -> None:
        self.layer = layer
        self.channel = Channel(layer, loop, self.receive, clock)
        self.ordering = Ordering(loop, self.channel.spawn, self._dispatch, clock)
        self.accounts = Accounts(self.ordering, self.channel.spawn, self._master_changed, clock)
        self.fairness = Fairness(self._audience, self._everyone, clock)
        self.listeners = Listeners(self.channel, self.ordering, self.accounts, self.fairness.charge)
        self.messages = 0  # ledger messages received (tests, diagnostics)

    # The registry, the fairness meter and the ordering call each other through the hub (they are
    # made one after the other).
    def _dispatch(self, feed: Feed, postings: list[Posting]) -> None:
        self.listeners.dispatch(feed, postings)

    def _audience(self, account: int) -> list[Listener]:
        return self.listeners.audience(account)

    def _everyone(self) -> set[Listener]:
        return self.listeners.everyone()

    def _master_changed(self, account: int, masters: set[int]) -> None:
        self.listeners.master_changed(account, masters)

    # --- the connections ---------------------------------------------------------------------------

    def add_keys(self, listener: Listener, owners: dict[str, int]) -> tuple[list[str], list[int]]:
        """Register listenKeys (and their accounts) for a connection. Returns the groups to await
        (`joined`) before reading the new accounts' sequences, and those accounts."""
        return self.listeners.add_keys(listener, owners)

    async def joined(self, groups: list[str]) -> None:
        """Until the hub's channel is in these groups (raises what joining raised)."""
        await self.channel.joined(groups)

    def start(self, listener: Listener, read: Read) -> None:
        """A connection's accounts start at the sequences it read (after registering)."""
        self.listeners.start(listener, read)

    def drop_key(self, listener: Listener, key: str) -> None:
        self.listeners.drop_key(listener, key)

    def drop_all(self, listener: Listener) -> None:
        """The connection goes (or is cut off): nothing more is given to it."""
        self.listeners.drop_all(listener)

    async def settle(self) -> None:
        """After a connection let go: wait for the hub's group changes, and stop receiving when
        no connection is left."""
        await self.channel.settle()
        if self.channel.needed():
            return
        self.ordering.stop()
        self.channel.stop()

    # --- the channel ---------------------------------------------------------------------------------

    def receive(self, message: dict) -> None:
        """A message from the channel: a ledger message's rows to their account's feed, a listenKey's
        close to its connections (before the next message is looked at)."""
        kind = message.get("type")
        if kind == "ledger.changes":
            self.messages += 1
            self.fairness.received(message.get("sent"))
            account = message["account"]
            feed = self.ordering.get(account)
            if feed is None:
                if not self.accounts.may_want(account):
                    return  # nobody here listens (a key closed while this was in flight)
                feed = self.ordering.feed(account)
                self.accounts.resolve(feed)
            self.ordering.add(feed, message["rows"], message.get("email"))
            self.accounts.heard(account)
        elif kind == "listenkey.closed":
            self.listeners.key_closed(message)

    # --- the watcher ---------------------------------------------------------------------------------

    def followed(self) -> list[int]:
        """The accounts whose feeds have started (for the watcher's catch-up)."""
        return self.ordering.followed()

    def catch_up(self, seqs: dict[int, int]) -> None:
        """The watcher read the accounts' committed sequences: a feed behind them waits
        STREAM_GAP_WAIT_SECONDS for the rows in flight, then reads the rest."""
        self.ordering.catch_up(seqs)

    def maintain(self) -> None:
        """The watcher's periodic upkeep: rejoin the groups now and then, forget accounts nobody
        here has listened to for a while."""
        self.channel.maintain()
        self.accounts.maintain()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Hub]] = weakref.WeakKeyDictionary()


def hub_for(layer, clock: Callable[[], float] = time.monotonic) -> Hub:
    """This event loop's hub for `layer` (the server's: one per process); `clock` is the one a hub
    made now gets."""
    loop = asyncio.get_running_loop()
    hubs = _hubs.setdefault(loop, {})
    hub = hubs.get(id(layer))
    if hub is None or hub.layer is not layer:
        hub = hubs[id(layer)] = Hub(layer, loop, clock)
    return hub


def hubs() -> list[Hub]:
    with contextlib.suppress(RuntimeError):
        return list(_hubs.get(asyncio.get_running_loop(), {}).values())
    return []
