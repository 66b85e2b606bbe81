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
  dropped). Duplicates (the sweeper resending, a row that came both ways) are dropped.
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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

from accounts.models import User
from exchange.outage import Outage
from streams import relay
from streams.events import build_events
from streams.services import key_group

logger = logging.getLogger(__name__)

# Default of the setting (exchange/settings/base.py, docs/streams.md), for settings modules without it.
GAP_WAIT_SECONDS = 0.2
# Recent postings kept per account to start a new connection where it should without a query: at
# most this many, dispatched within HISTORY_SECONDS (registering, reading and starting take ms).
HISTORY_POSTINGS = 256
HISTORY_SECONDS = 5.0
# How long what the hub knows of an account (its e-mail, its whitelisted master) is used before it
# is read again; the relay's own audience cache has the same age.
INFO_SECONDS = relay.AUDIENCE_TTL_SECONDS
# A sub-account the hub first hears of (not in its master's connections' reads) that was created
# this recently is new to them: all its events are theirs, from its first sequence.
NEW_SUB_ACCOUNT_SECONDS = 120.0
RETRY_SECONDS = 1.0  # after a failed database read


def gap_wait_seconds() -> float:
    return getattr(settings, "STREAM_GAP_WAIT_SECONDS", GAP_WAIT_SECONDS)


# --- what the hub knows of accounts -----------------------------------------------------------


@dataclass
class AccountInfo:
    email: str
    master: int | None  # its master, whether whitelisted or not
    whitelisted: bool  # the master is whitelisted: its connections see this account's events
    joined: float  # date_joined, epoch seconds
    expires: float = 0.0  # monotonic


@dataclass
class Read:
    """Accounts' sequences (events up to them are history) and what is known of them, read after
    the groups that carry their events were joined."""

    seqs: dict[int, int]
    infos: dict[int, AccountInfo]
    subs: dict[int, int]  # sub-account of a requested whitelisted master -> that master


def _infos(account_ids: Iterable[int], masters: list[int] | None = None) -> dict[int, AccountInfo]:
    """What is known of the accounts; `masters` collects those that are whitelisted masters."""
    rows = User.objects.filter(pk__in=set(account_ids)).values_list(
        "pk", "email", "master_id", "master__is_whitelisted_master", "date_joined", "is_whitelisted_master"
    )
    infos = {}
    for pk, email, master, whitelisted, joined, is_whitelisted_master in rows:
        infos[pk] = AccountInfo(email, master, bool(master and whitelisted), joined.timestamp())
        if is_whitelisted_master and masters is not None:
            masters.append(pk)
    return infos


def read_accounts(account_ids: list[int]) -> Read:
    """At most three queries for any number of accounts: the accounts, the sub-accounts of those
    that are whitelisted masters, everybody's current sequence."""
    masters: list[int] = []
    infos = _infos(account_ids, masters)
    subs: dict[int, int] = {}
    if masters:
        rows = User.objects.filter(master_id__in=masters).values_list("pk", "email", "master_id", "date_joined")
        for pk, email, master, joined in rows:
            subs[pk] = master
            infos.setdefault(pk, AccountInfo(email, master, True, joined.timestamp()))
    seqs = relay.current_seqs([*account_ids, *subs])
    return Read({a: seqs.get(a, 0) for a in [*account_ids, *subs]}, infos, subs)


# --- postings and feeds ------------------------------------------------------------------------


class Posting:
    """One posting's consecutive rows of one account, and its frames: the events as JSON text, built
    once per view (None: the account's own; an e-mail: its whitelisted master's) for everybody."""

    __slots__ = ("_frames", "at", "built_ms", "first", "last", "rows")

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.first = rows[0]["seq"]
        self.last = rows[-1]["seq"]
        self.at = time.monotonic()
        self.built_ms = int(time.time() * 1000)
        self._frames: dict[str | None, list[str]] = {}

    def frames(self, email: str | None) -> list[str]:
        frames = self._frames.get(email)
        if frames is None:
            events = build_events(self.rows, email=email, now_ms=self.built_ms)
            frames = self._frames[email] = [json.dumps(event) for event in events]
        return frames


def postings_of(rows: list[dict]) -> list[Posting]:
    postings, start = [], 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end]["posting"] != rows[start]["posting"]:
            postings.append(Posting(rows[start:end]))
            start = end
    return postings


class Feed:
    """One account's events in this process, in sequence order."""

    def __init__(self, account: int) -> None:
        self.account = account
        self.last: int | None = None  # the last sequence dispatched; None until the feed starts
        self.anchor: int | None = None  # where it started
        self.ahead: dict[int, dict] = {}  # rows that arrived beyond last + 1, by sequence
        self.behind_to = 0  # the account's sequence as the watcher last saw it committed
        self.history: deque[Posting] = deque(maxlen=HISTORY_POSTINGS)
        self.progress_at = time.monotonic()  # when the feed last moved on (or started waiting)
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


# --- connections -------------------------------------------------------------------------------


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


class Hub:
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
        # Counters (tests, diagnostics).
        self.messages = 0  # ledger messages received
        self.waits = 0  # times rows arrived ahead of a missing sequence and the hub waited for it
        self.fills = 0  # feed gap fills and catch-ups read from the database
        self.replays = 0  # connections started from the database (their start beyond the history)

    # --- registration (called by the connections) ----------------------------------------------

    def add_keys(self, listener: Listener, owners: dict[str, int]) -> tuple[list[str], list[int]]:
        """Register listenKeys (and their accounts) for a connection. Returns the groups to await
        (`joined`) before reading the new accounts' sequences, and those accounts."""
        groups, accounts = [], []
        for key, account in owners.items():
            if key in listener.keys:
                continue
            listener.keys[key] = account
            self.key_listeners.setdefault(key, set()).add(listener)
            groups.append(self._ref(key_group(key), +1))
            count = listener.own.get(account, 0)
            listener.own[account] = count + 1
            if count == 0:
                accounts.append(account)
                self.interest[account] = self.interest.get(account, 0) + 1
                groups.append(self._ref(relay.account_group(account), +1))
                self._feed(account)  # holds the account's rows until a connection starts on it
        self._ensure_receiving()
        return groups, accounts

    async def joined(self, groups: list[str]) -> None:
        """Until the hub's channel is in these groups (raises what joining raised)."""
        for group in groups:
            while group in self.refs and group not in self.members:
                task = self.reconciling.get(group) or self._reconcile_soon(group)
                await asyncio.shield(task)

    def start(self, listener: Listener, read: Read) -> None:
        """A connection's accounts start at the sequences it read (after registering)."""
        if listener.gone:
            return
        started = []
        for account in read.seqs:
            if account in listener.own and account not in listener.active:
                listener.active.add(account)
                self.own_listeners.setdefault(account, set()).add(listener)
                started.append(account)
        for account, info in read.infos.items():
            self._learn(account, info)
        for account in started:
            self._attach(listener, account, read.seqs[account])
        for sub, master in read.subs.items():
            if master in listener.active and sub not in listener.own:
                self._attach(listener, sub, read.seqs[sub])

    def drop_key(self, listener: Listener, key: str) -> None:
        account = listener.keys.pop(key, None)
        if account is None:
            return
        listeners = self.key_listeners.get(key)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self.key_listeners[key]
        self._ref(key_group(key), -1)
        count = listener.own[account] - 1
        if count:
            listener.own[account] = count
            return
        del listener.own[account]
        self._ref(relay.account_group(account), -1)
        self._uninterest(account)
        if account in listener.active:
            listener.active.discard(account)
            self.own_listeners[account].discard(listener)
            if not self.own_listeners[account]:
                del self.own_listeners[account]
        for watched in list(listener.sent):
            if not self._listens(listener, watched):
                listener.sent.pop(watched, None)
                listener.held.pop(watched, None)
        self._forget_unwanted([account, *self.subs_of.get(account, ())])

    def drop_all(self, listener: Listener) -> None:
        """The connection goes (or is cut off): nothing more is given to it."""
        listener.gone = True
        for key in list(listener.keys):
            self.drop_key(listener, key)

    async def settle(self) -> None:
        """After a connection let go: wait for the hub's group changes, and stop receiving when
        no connection is left."""
        for task in list(self.reconciling.values()):
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        if self.refs or self.reconciling:
            return
        for feed in self.feeds.values():
            feed.stop()
        self.feeds.clear()
        for task in [*self.tasks, self.refresher]:
            if task is not None:
                task.cancel()
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            # Not awaited: channels_redis may take until its blocking read times out to let go of
            # a cancelled receive (as with the consumers' own receives, which nobody awaits either).
            receiver.cancel()

    def catch_up(self, seqs: dict[int, int]) -> None:
        """The watcher read the accounts' committed sequences: a feed behind them waits
        STREAM_GAP_WAIT_SECONDS for the rows in flight, then reads the rest."""
        for account, seq in seqs.items():
            feed = self.feeds.get(account)
            if feed is not None and feed.last is not None and seq > max(feed.last, feed.behind_to):
                feed.behind_to = seq
                if feed.timer is None and feed.filling is None:
                    feed.progress_at = time.monotonic()  # rows in flight: give them the gap's wait
                self._advance(feed)

    def followed(self) -> list[int]:
        """The accounts whose feeds have started (for the watcher's catch-up)."""
        return [account for account, feed in self.feeds.items() if feed.last is not None]

    # --- group membership -----------------------------------------------------------------------

    def _ref(self, group: str, delta: int) -> str:
        count = self.refs.get(group, 0) + delta
        if count > 0:
            self.refs[group] = count
        else:
            self.refs.pop(group, None)
        if (group in self.refs) != (group in self.members) and group not in self.reconciling:
            self._reconcile_soon(group)
        return group

    def _reconcile_soon(self, group: str) -> asyncio.Task:
        task = self.reconciling[group] = self.loop.create_task(self._reconcile(group))
        task.add_done_callback(_retrieve)
        return task

    async def _reconcile(self, group: str) -> None:
        """Join or leave `group` until membership matches the registrations (they may change while
        a call is under way)."""
        try:
            channel = await self._channel()
            while (group in self.refs) != (group in self.members):
                if group in self.refs:
                    await self.layer.group_add(group, channel)
                    self.members.add(group)
                else:
                    self.members.discard(group)
                    await self.layer.group_discard(group, channel)
        finally:
            if self.reconciling.get(group) is asyncio.current_task():
                del self.reconciling[group]

    async def _channel(self) -> str:
        if self.channel is None:
            self.channel = await self.layer.new_channel()  # no I/O in either layer
        return self.channel

    # --- receiving ---------------------------------------------------------------------------------

    def _ensure_receiving(self) -> None:
        if self.receiver is None or self.receiver.done():
            self.receiver = self.loop.create_task(self._receive())

    async def _receive(self) -> None:
        channel = await self._channel()
        while True:
            try:
                message = await self.layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if cancelling():  # a library turned our cancellation into another error: stop anyway
                    raise
                RECEIVE_OUTAGE.failed(exc)  # it retries every RETRY_SECONDS meanwhile
                await asyncio.sleep(RETRY_SECONDS)
                continue
            RECEIVE_OUTAGE.ok()
            try:
                kind = message.get("type")
                if kind == "ledger.changes":
                    self._on_changes(message)
                elif kind == "listenkey.closed":
                    self._on_key_closed(message)
            except Exception:
                logger.exception("The stream hub could not handle a %s message", message.get("type"))

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

    async def _refresh_groups(self) -> None:
        """Group memberships expire (the layer's group_expiry, a day): a hub that stays in a group
        for longer, one connection after the other, joins it again now and then."""
        channel = await self._channel()
        for group in list(self.members):
            if group in self.refs:
                await self.layer.group_add(group, channel)

    def _on_key_closed(self, message: dict) -> None:
        key = message.get("key")
        for listener in list(self.key_listeners.get(key, ())):
            listener.key_closed(key, message)

    def _on_changes(self, message: dict) -> None:
        self.messages += 1
        account = message["account"]
        feed = self.feeds.get(account)
        if feed is None:
            if not self._may_want(account):
                return  # nobody here listens (a key closed while this was in flight)
            feed = self._feed(account)
            feed.resolving = True
            self._spawn(self._resolve(feed))
        if message.get("email"):
            feed.email = message["email"]
        last = feed.last
        for row in message["rows"]:
            seq = row["seq"]
            if last is None or seq > last:
                feed.ahead.setdefault(seq, row)
        if feed.first_arrival is None:
            feed.first_arrival = time.monotonic()
        self._advance(feed)
        info = self.info.get(account)
        if info is not None and info.expires < time.monotonic() and self.interest.get(info.master):
            self._refresh_info(account)

    # --- feeds -----------------------------------------------------------------------------------

    def _feed(self, account: int) -> Feed:
        feed = self.feeds.get(account)
        if feed is None:
            feed = self.feeds[account] = Feed(account)
        return feed

    def _begin(self, feed: Feed, start: int) -> None:
        feed.last = feed.anchor = start
        for seq in [seq for seq in feed.ahead if seq <= start]:
            del feed.ahead[seq]
        feed.progress_at = time.monotonic()
        self._advance(feed)

    def _advance(self, feed: Feed) -> None:
        """Dispatch what follows the last sequence; wait for (or read) what is missing."""
        if feed.last is None:
            return
        run, seq = [], feed.last + 1
        while seq in feed.ahead:
            run.append(feed.ahead.pop(seq))
            seq += 1
        if run:
            feed.progress_at = time.monotonic()
            self._dispatch(feed, run)
        if feed.behind():
            if feed.timer is None and feed.filling is None:
                self.waits += 1
                wait = max(0.0, feed.progress_at + gap_wait_seconds() - time.monotonic())
                feed.timer = self.loop.call_later(wait, self._gap_due, feed)
        elif feed.timer is not None:
            feed.timer.cancel()
            feed.timer = None

    def _gap_due(self, feed: Feed) -> None:
        feed.timer = None
        if self.feeds.get(feed.account) is not feed or feed.filling is not None or not feed.behind():
            return
        due = feed.progress_at + gap_wait_seconds()
        if time.monotonic() < due:  # it moved on meanwhile: wait for the rest from then
            feed.timer = self.loop.call_later(due - time.monotonic(), self._gap_due, feed)
            return
        feed.filling = self._spawn(self._fill(feed))

    async def _fill(self, feed: Feed) -> None:
        """A real gap (or the watcher's catch-up): read the missing rows, once for the account."""
        first = feed.last + 1
        upto = max(max(feed.ahead, default=0), feed.behind_to)
        try:
            rows = await database_sync_to_async(relay.rows_between)(feed.account, first, upto)
        except asyncio.CancelledError:
            raise
        except Exception:
            if cancelling():
                raise
            logger.exception("Could not read account %s's rows %s-%s; retrying", feed.account, first, upto)
            feed.filling = None
            feed.progress_at = time.monotonic() + RETRY_SECONDS - gap_wait_seconds()
            self._advance(feed)
            return
        feed.filling = None
        if self.feeds.get(feed.account) is not feed:
            return
        self.fills += 1
        for row in rows:
            if row["seq"] > feed.last:
                feed.ahead[row["seq"]] = row
        if feed.ahead and feed.last + 1 not in feed.ahead:
            # Not in the database either (it cannot be: sequences have no holes): skip it rather
            # than read it again and again.
            logger.error("Account %s's rows %s-%s are missing from the change feed", feed.account, first, upto)
            feed.last = min(feed.ahead) - 1
        feed.behind_to = 0  # read up to it: what is there was found (the watcher looks again)
        feed.progress_at = time.monotonic()
        self._advance(feed)

    def _dispatch(self, feed: Feed, rows: list[dict]) -> None:
        postings = postings_of(rows)
        for posting in postings:
            feed.last = posting.last
            feed.remember(posting)
        for listener in self._audience(feed.account):
            for posting in postings:
                if listener.gone:
                    break
                self._deliver(listener, feed, posting)

    def _audience(self, account: int) -> list[Listener]:
        listeners = list(self.own_listeners.get(account, ()))
        info = self.info.get(account)
        if info is not None and info.whitelisted and info.master is not None:
            listeners += [
                listener for listener in self.own_listeners.get(info.master, ()) if account not in listener.active
            ]
        return listeners

    def _listens(self, listener: Listener, account: int) -> bool:
        if account in listener.active:
            return True
        info = self.info.get(account)
        return info is not None and info.whitelisted and info.master in listener.active

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
        info = self.info.get(feed.account)
        return feed.email or (info.email if info is not None else "") or None

    def _attach(self, listener: Listener, account: int, start: int) -> None:
        """The connection starts on the account at `start`: it is given every posting after it."""
        if account in listener.sent or listener.gone:
            return  # already given this account's events (another view, another key): go on from there
        feed = self._feed(account)
        listener.sent[account] = start
        if feed.last is None:
            if not feed.resolving:
                self._begin(feed, start)
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
        self._spawn(self._replay(listener, feed, start, feed.last))

    async def _replay(self, listener: Listener, feed: Feed, start: int, upto: int) -> None:
        """A connection started further back than the feed's history reaches."""
        account = feed.account
        try:
            rows = await database_sync_to_async(relay.rows_between)(account, start + 1, upto)
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

    # --- who listens ------------------------------------------------------------------------------

    def _learn(self, account: int, info: AccountInfo) -> None:
        info.expires = time.monotonic() + INFO_SECONDS
        old = self.info.get(account)
        self.info[account] = info
        if old is not None and old.master is not None and old.master != info.master:
            self.subs_of.get(old.master, set()).discard(account)
        if info.master is not None:
            self.subs_of.setdefault(info.master, set()).add(account)

    def _may_want(self, account: int) -> bool:
        info = self.info.get(account)
        if info is None or info.expires < time.monotonic():
            return True  # unknown: find out
        return bool(info.whitelisted and self.interest.get(info.master))

    def _wanted(self, account: int) -> bool:
        if self.interest.get(account):
            return True
        info = self.info.get(account)
        return bool(info is not None and info.whitelisted and self.interest.get(info.master))

    def _uninterest(self, account: int) -> None:
        count = self.interest.get(account, 0) - 1
        if count > 0:
            self.interest[account] = count
        else:
            self.interest.pop(account, None)

    def _forget_unwanted(self, accounts: Iterable[int]) -> None:
        for account in accounts:
            feed = self.feeds.get(account)
            if feed is not None and not feed.resolving and not self._wanted(account):
                feed.stop()
                del self.feeds[account]

    async def _resolve(self, feed: Feed) -> None:
        """A message for an account the hub does not follow: a whitelisted master's sub-account
        (created after the master's connections read theirs, or the master whitelisted since)?"""
        account = feed.account
        try:
            infos = await database_sync_to_async(_infos)([account])
        except Exception:
            logger.exception("Could not look up account %s", account)
            infos = {}
        feed.resolving = False
        if self.feeds.get(account) is not feed:
            return
        if account in infos:
            self._learn(account, infos[account])
        if not self._wanted(account):
            feed.stop()
            del self.feeds[account]
            return
        if feed.last is not None:
            return  # a connection started it meanwhile
        info = self.info[account]
        feed.discovered = True
        if time.time() - info.joined < NEW_SUB_ACCOUNT_SECONDS:
            self._begin(feed, 0)
            return
        # Older: from the lowest sequence that arrives while waiting for the other publishers.
        wait = (feed.first_arrival or time.monotonic()) + gap_wait_seconds() - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if self.feeds.get(account) is feed and feed.last is None:
            self._begin(feed, min(feed.ahead, default=1) - 1)

    def _refresh_info(self, account: int) -> None:
        """Read an account's master and its whitelisted flag again (in the background, several
        accounts at once): an operator's change reaches the connections within INFO_SECONDS."""
        if account in self.stale:
            return
        self.stale.add(account)
        if self.refresher is None or self.refresher.done():
            self.refresher = self._spawn(self._refresh_infos())

    async def _refresh_infos(self) -> None:
        await asyncio.sleep(0)  # gather the accounts of this round
        accounts, self.stale = self.stale, set()
        try:
            infos = await database_sync_to_async(_infos)(accounts)
        except Exception:
            logger.exception("Could not read %s accounts again", len(accounts))
            return
        for account, info in infos.items():
            masters = {info.master, getattr(self.info.get(account), "master", None)} - {None}
            self._learn(account, info)
            # A master that is no longer whitelisted: its connections forget the sub-account (and
            # start from then on should it be whitelisted again).
            for master in masters:
                for listener in self.own_listeners.get(master, ()):
                    if account in listener.sent and not self._listens(listener, account):
                        listener.sent.pop(account, None)
                        listener.held.pop(account, None)
        self._forget_unwanted(infos)

    # --- background work -------------------------------------------------------------------------

    def _spawn(self, coroutine) -> asyncio.Task:
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(_retrieve)
        return task


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        TASK_OUTAGE.failed(task.exception())  # a Redis outage fails many at once: logged once, then every 10 s


TASK_OUTAGE = Outage(logger, "Stream hub task failed")
RECEIVE_OUTAGE = Outage(logger, "The stream hub could not receive; retrying", settle=0.0)

_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Hub]] = weakref.WeakKeyDictionary()


def cancelling() -> bool:
    """Whether the current task has been asked to stop (Task.cancelling: Python 3.11+)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


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
