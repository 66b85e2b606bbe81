"""The listener registry (`Listeners`): connections register their listenKeys (and accounts), start at the
sequences they read, drop keys; each posting goes to the connections that listen to its account (own
view or a whitelisted master's), once, in order, from the feed's history or a database replay."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from streams import relay
from streams.hub.accounts import Accounts, Read
from streams.hub.channel import Channel
from streams.hub.fairness import caused_by_holder
from streams.hub.frames import Posting, postings_of
from streams.hub.ordering import Feed, Ordering
from streams.services import key_group

logger = logging.getLogger(__package__)  # streams.hub, as before the split


@dataclass(eq=False)
class Listener:
    """One connection as the hub sees it. `push` takes a posting's frames for the connection's
    outbox; `key_closed(key, message)` is told, after the hub detached the key, that it was closed;
    `failed()` that the hub could not give it what it needs (it should close)."""

    push: Callable[[list[str]], None]
    key_closed: Callable[[str, dict], None]
    failed: Callable[[], None]
    keys: dict[str, int] = field(default_factory=dict)  # listenKey -> its account
    own: dict[int, int] = field(default_factory=dict)  # account -> how many of its keys
    active: set[int] = field(default_factory=set)  # own accounts whose start is known
    sent: dict[int, int] = field(default_factory=dict)  # account -> last sequence given (or start)
    held: dict[int, list[Posting]] = field(default_factory=dict)  # account -> while a replay is read
    gone: bool = False
    # Told that it is cut off for the hub being behind (it closes 4006).
    too_slow: Callable[[], None] = lambda: None
    # (seconds its oldest frame not yet taken by the client has waited, frames waiting): the hub,
    # behind, closes the connections that do not keep up first (fairness.py).
    lag: Callable[[], tuple[float, int]] = lambda: (0.0, 0)


class Listeners:
    """The connections by listenKey and by account, and the delivery to them. It asks `channel` for
    the groups its registrations need, `ordering` for the feeds they start, `accounts` what is known
    of an account and who else listens, and `charge(account, writes, caused)` each dispatch's cost."""

    def __init__(
        self,
        channel: Channel,
        ordering: Ordering,
        accounts: Accounts,
        charge: Callable[[int, int, int], None],
    ) -> None:
        self.channel = channel
        self.ordering = ordering
        self.accounts = accounts
        self.charge = charge
        self._by_key: dict[str, set[Listener]] = {}
        self._by_account: dict[int, set[Listener]] = {}  # account -> listeners started on it
        self.replays = 0  # connections started from the database (their start beyond the history)

    # --- registration (called by the connections) ----------------------------------------------

    def add_keys(self, listener: Listener, owners: dict[str, int]) -> tuple[list[str], list[int]]:
        """Register listenKeys (and their accounts) for a connection. Returns the groups to await
        (`Hub.joined`) before reading the new accounts' sequences, and those accounts."""
        groups, accounts = [], []
        for key, account in owners.items():
            if key in listener.keys:
                continue
            listener.keys[key] = account
            self._by_key.setdefault(key, set()).add(listener)
            groups.append(self.channel.ref(key_group(key), +1))
            count = listener.own.get(account, 0)
            listener.own[account] = count + 1
            if count == 0:
                accounts.append(account)
                self.accounts.interested(account)
                groups.append(self.channel.ref(relay.account_group(account), +1))
                self.ordering.feed(account)  # holds the account's rows until a connection starts on it
        self.channel.receive()
        return groups, accounts

    def start(self, listener: Listener, read: Read) -> None:
        """A connection's accounts start at the sequences it read (after registering)."""
        if listener.gone:
            return
        started = []
        for account in read.seqs:
            if account in listener.own and account not in listener.active:
                listener.active.add(account)
                self._by_account.setdefault(account, set()).add(listener)
                started.append(account)
        for account, info in read.infos.items():
            self.accounts.learn(account, info)
        for account in started:
            self._attach(listener, account, read.seqs[account])
        for sub, master in read.subs.items():
            if master in listener.active and sub not in listener.own:
                self._attach(listener, sub, read.seqs[sub])

    def drop_key(self, listener: Listener, key: str) -> None:
        account = listener.keys.pop(key, None)
        if account is None:
            return
        listeners = self._by_key.get(key)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._by_key[key]
        self.channel.ref(key_group(key), -1)
        count = listener.own[account] - 1
        if count:
            listener.own[account] = count
            return
        del listener.own[account]
        self.channel.ref(relay.account_group(account), -1)
        self.accounts.uninterested(account)
        if account in listener.active:
            listener.active.discard(account)
            self._by_account[account].discard(listener)
            if not self._by_account[account]:
                del self._by_account[account]
        for watched in list(listener.sent):
            if not self._listens(listener, watched):
                listener.sent.pop(watched, None)
                listener.held.pop(watched, None)
        self.accounts.forget_unwanted([account, *self.accounts.subs(account)])

    def drop_all(self, listener: Listener) -> None:
        """The connection goes (or is cut off): nothing more is given to it."""
        listener.gone = True
        for key in list(listener.keys):
            self.drop_key(listener, key)

    # --- who listens -----------------------------------------------------------------------------

    def audience(self, account: int) -> list[Listener]:
        """The connections that get the account's events: its own, and its whitelisted master's."""
        listeners = list(self._by_account.get(account, ()))
        master = self.accounts.watched_by(account)
        if master is not None:
            listeners += [listener for listener in self._by_account.get(master, ()) if account not in listener.active]
        return listeners

    def everyone(self) -> set[Listener]:
        """Every connection started on an account here."""
        return {listener for listeners in self._by_account.values() for listener in listeners}

    def master_changed(self, account: int, masters: set[int]) -> None:
        """What is known of the account changed: its former or current masters' connections that no
        longer see it forget it (and start from then on should they see it again)."""
        for master in masters:
            for listener in self._by_account.get(master, ()):
                if account in listener.sent and not self._listens(listener, account):
                    listener.sent.pop(account, None)
                    listener.held.pop(account, None)

    def _listens(self, listener: Listener, account: int) -> bool:
        if account in listener.active:
            return True
        master = self.accounts.watched_by(account)
        return master is not None and master in listener.active

    # --- delivery --------------------------------------------------------------------------------

    def key_closed(self, message: dict) -> None:
        key = message.get("key")
        for listener in list(self._by_key.get(key, ())):
            listener.key_closed(key, message)

    def dispatch(self, feed: Feed, postings: list[Posting]) -> None:
        """The feed's next postings, in order: to every connection that gets them."""
        audience = self.audience(feed.account)
        for listener in audience:
            for posting in postings:
                if listener.gone:
                    break
                self._deliver(listener, feed, posting)
        if audience:
            caused = sum(1 for posting in postings if caused_by_holder(posting.rows))
            self.charge(feed.account, len(audience) * len(postings), len(audience) * caused)

    def _deliver(self, listener: Listener, feed: Feed, posting: Posting) -> None:
        account = feed.account
        sent = listener.sent.get(account)
        if sent is None:
            # A master's connection hears of a sub-account it did not read (created since, or the
            # master whitelisted since): a feed the hub discovered from the start it chose (a new
            # sub-account: its first sequence), any other from this posting on.
            self._attach(listener, account, feed.anchor if feed.discovered else posting.first - 1)
            return
        if posting.last <= sent:
            return
        held = listener.held.get(account)
        if held is not None:
            held.append(posting)
            return
        listener.sent[account] = posting.last
        listener.push(posting.frames(self._view(listener, feed)))

    def _view(self, listener: Listener, feed: Feed) -> str | None:
        if feed.account in listener.own:
            return None
        info = self.accounts.info(feed.account)
        return feed.email or (info.email if info is not None else "") or None

    def _attach(self, listener: Listener, account: int, start: int) -> None:
        """The connection starts on the account at `start`: it is given every posting after it."""
        if account in listener.sent or listener.gone:
            return  # already given this account's events (another view, another key): go on from there
        feed = self.ordering.feed(account)
        listener.sent[account] = start
        if feed.last is None:
            # The connection's read is where the account starts, even while the hub is still
            # finding out who listens to a message that came first (`Accounts.resolve`): left to
            # it, an older account would start at the lowest sequence that arrived, past rows still
            # on their way from another publisher that this connection is owed.
            self.ordering.begin(feed, start)
            return
        if start >= feed.last:
            return
        history = feed.history
        if history and history[0].first <= start + 1:
            for posting in history:
                if listener.gone:
                    return
                self._deliver(listener, feed, posting)
            return
        listener.held[account] = []
        self.channel.spawn(self._replay(listener, feed, start, feed.last))

    async def _replay(self, listener: Listener, feed: Feed, start: int, upto: int) -> None:
        """A connection started further back than the feed's history reaches."""
        account = feed.account
        try:
            rows = await self.ordering.rows(account, start + 1, upto)
        except Exception:
            logger.exception("Could not read account %s's rows %s-%s for a connection", account, start + 1, upto)
            listener.held.pop(account, None)
            listener.failed()
            return
        self.replays += 1
        held = listener.held.pop(account, None)
        if held is None or listener.gone:
            return  # no longer listened to
        for posting in [*postings_of(rows), *held] if rows else held:
            if listener.gone:
                return
            self._deliver(listener, feed, posting)
