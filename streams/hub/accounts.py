"""What the hub knows of accounts (e-mail, master, whitelisted master) and who listens to an account:
the database reads, the interest counts, a sub-account discovered from a message, the periodic re-read."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from channels.db import database_sync_to_async

from accounts.models import User, family_email
from streams import relay
from streams.hub.ordering import Feed, gap_wait_seconds

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


class AccountsMixin:
    """The Hub's knowledge of accounts; `info`, `subs_of`, `interest`, `stale`, `refresher` are set up
    in Hub.__init__ (streams/hub/__init__.py)."""

    feeds: dict[int, Feed]
    info: dict[int, AccountInfo]
    subs_of: dict[int, set[int]]
    interest: dict[int, int]
    stale: set[int]
    refresher: asyncio.Task | None

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
