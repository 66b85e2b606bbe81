"""What the hub knows of accounts (`Accounts`: e-mail, master, whitelisted master) and who listens to
an account: the database reads, the interest counts, a sub-account discovered from a message, the
periodic re-read."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass

from channels.db import database_sync_to_async

from accounts.models import User, family_email
from streams import relay
from streams.hub.ordering import Feed, Ordering, gap_wait_seconds

logger = logging.getLogger(__package__)  # streams.hub, as before the split

# How long what the hub knows of an account (its e-mail, its whitelisted master) is used before it
# is read again; the relay's own audience cache has the same age.
INFO_SECONDS = relay.AUDIENCE_TTL_SECONDS
# A sub-account the hub first hears of (not in its master's connections' reads) that was created
# this recently is new to them: all its events are theirs, from its first sequence.
NEW_SUB_ACCOUNT_SECONDS = 120.0


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
        "pk",
        "email",
        "requested_email",
        "master_id",
        "master__is_whitelisted_master",
        "date_joined",
        "is_whitelisted_master",
    )
    infos = {}
    for pk, email, requested_email, master, whitelisted, joined, is_whitelisted_master in rows:
        named = family_email(email, requested_email)  # `em` on the master's stream
        infos[pk] = AccountInfo(named, master, bool(master and whitelisted), joined.timestamp())
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
        rows = User.objects.filter(master_id__in=masters).values_list(
            "pk", "email", "requested_email", "master_id", "date_joined"
        )
        for pk, email, requested_email, master, joined in rows:
            subs[pk] = master
            infos.setdefault(pk, AccountInfo(family_email(email, requested_email), master, True, joined.timestamp()))
    seqs = relay.current_seqs([*account_ids, *subs])
    return Read({a: seqs.get(a, 0) for a in [*account_ids, *subs]}, infos, subs)


class Accounts:
    """What the hub knows of accounts, and how many connections own each. It forgets the feeds
    (`ordering`) of accounts nobody here listens to any more; `spawn` runs its reads in the
    background; `master_changed(account)` is told when a re-read found an account's master or its
    whitelisted flag changed (its master's connections may no longer see it); `clock` is monotonic
    seconds."""

    def __init__(
        self,
        ordering: Ordering,
        spawn: Callable[[Coroutine], asyncio.Task],
        master_changed: Callable[[int, set[int]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ordering = ordering
        self.spawn = spawn
        self.master_changed = master_changed
        self.clock = clock
        self._info: dict[int, AccountInfo] = {}
        self._subs_of: dict[int, set[int]] = {}  # master -> sub-accounts the hub knows
        self._interest: dict[int, int] = {}  # account -> listeners that own it (started or not)
        self._stale: set[int] = set()  # accounts whose info is being read again
        self._refresher: asyncio.Task | None = None

    # --- what is known ---------------------------------------------------------------------------

    def info(self, account: int) -> AccountInfo | None:
        return self._info.get(account)

    def watched_by(self, account: int) -> int | None:
        """The whitelisted master whose connections see the account's events, if any."""
        info = self._info.get(account)
        return info.master if info is not None and info.whitelisted else None

    def subs(self, master: int) -> set[int]:
        """The master's sub-accounts the hub knows."""
        return set(self._subs_of.get(master, ()))

    def learn(self, account: int, info: AccountInfo) -> None:
        info.expires = self.clock() + INFO_SECONDS
        old = self._info.get(account)
        self._info[account] = info
        if old is not None and old.master is not None and old.master != info.master:
            self._subs_of.get(old.master, set()).discard(account)
        if info.master is not None:
            self._subs_of.setdefault(info.master, set()).add(account)

    # --- who listens -----------------------------------------------------------------------------

    def interested(self, account: int) -> None:
        """One more connection owns the account."""
        self._interest[account] = self._interest.get(account, 0) + 1

    def uninterested(self, account: int) -> None:
        """One connection fewer owns the account."""
        count = self._interest.get(account, 0) - 1
        if count > 0:
            self._interest[account] = count
        else:
            self._interest.pop(account, None)

    def may_want(self, account: int) -> bool:
        """Whether a message for an account without a feed may be for a connection here."""
        info = self._info.get(account)
        if info is None or info.expires < self.clock():
            return True  # unknown: find out
        return bool(info.whitelisted and self._interest.get(info.master))

    def wanted(self, account: int) -> bool:
        if self._interest.get(account):
            return True
        info = self._info.get(account)
        return bool(info is not None and info.whitelisted and self._interest.get(info.master))

    def forget_unwanted(self, accounts: Iterable[int]) -> None:
        """The feeds of these accounts go if nobody here listens to them any more."""
        for account in accounts:
            feed = self.ordering.get(account)
            if feed is not None and not feed.resolving and not self.wanted(account):
                self.ordering.drop(account)

    def maintain(self) -> None:
        """Forget accounts nobody here has listened to for a while."""
        now = self.clock()
        masters = {info.master for info in self._info.values() if info.master is not None}
        for account in [
            account
            for account, info in self._info.items()
            if info.expires < now - INFO_SECONDS
            and self.ordering.get(account) is None
            and account not in self._interest
            and account not in masters
        ]:
            del self._info[account]
        for master in [master for master, subs in self._subs_of.items() if not subs & self._info.keys()]:
            del self._subs_of[master]

    # --- reads -----------------------------------------------------------------------------------

    def heard(self, account: int) -> None:
        """A message for the account: what is known of it is read again once it is old (and a
        master here listens), so that an operator's change reaches the connections within
        INFO_SECONDS."""
        info = self._info.get(account)
        if info is not None and info.expires < self.clock() and self._interest.get(info.master):
            self._refresh(account)

    def resolve(self, feed: Feed) -> None:
        """A message for an account the hub does not follow: find out (in the background) whether
        it is a whitelisted master's sub-account, created after the master's connections read
        theirs, or the master whitelisted since."""
        feed.resolving = True
        self.spawn(self._resolve(feed))

    async def _resolve(self, feed: Feed) -> None:
        account = feed.account
        try:
            infos = await database_sync_to_async(_infos)([account])
        except Exception:
            logger.exception("Could not look up account %s", account)
            infos = {}
        feed.resolving = False
        if self.ordering.get(account) is not feed:
            return
        if account in infos:
            self.learn(account, infos[account])
        if not self.wanted(account):
            self.ordering.drop(account)
            return
        if feed.last is not None:
            return  # a connection started it meanwhile
        info = self._info[account]
        feed.discovered = True
        if time.time() - info.joined < NEW_SUB_ACCOUNT_SECONDS:
            self.ordering.begin(feed, 0)
            return
        # Older: from the lowest sequence that arrives while waiting for the other publishers.
        wait = (feed.first_arrival or self.clock()) + gap_wait_seconds() - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        if self.ordering.get(account) is feed and feed.last is None:
            self.ordering.begin(feed, min(feed.ahead, default=1) - 1)

    def _refresh(self, account: int) -> None:
        """Read an account's master and its whitelisted flag again (in the background, several
        accounts at once)."""
        if account in self._stale:
            return
        self._stale.add(account)
        if self._refresher is None or self._refresher.done():
            self._refresher = self.spawn(self._refresh_infos())

    async def _refresh_infos(self) -> None:
        await asyncio.sleep(0)  # gather the accounts of this round
        accounts, self._stale = self._stale, set()
        try:
            infos = await database_sync_to_async(_infos)(accounts)
        except Exception:
            logger.exception("Could not read %s accounts again", len(accounts))
            return
        for account, info in infos.items():
            masters = {info.master, getattr(self._info.get(account), "master", None)} - {None}
            self.learn(account, info)
            self.master_changed(account, masters)
        self.forget_unwanted(infos)
