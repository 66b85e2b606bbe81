"""The user data stream: /openapi/ws/<listenKey>.

A connection starts with one listenKey and may add more (up to 1024 streams) with
`{"method": "SUBSCRIBE", "params": [...], "id": n}` and remove them with UNSUBSCRIBE; each request
is answered `{"result": null, "id": n}` or `{"error": {"code", "msg"}, "id": n}`. The connection
closes when its first key expires or is closed, and after 24 hours; a further key that dies is
dropped from the connection. Daphne pings idle clients and drops those that do not answer
(--ping-interval / --ping-timeout).

Bounds (docs/streams.md): at most STREAM_MAX_CONNECTIONS_PER_KEY connections on one listenKey and
STREAM_MAX_CONNECTIONS_PER_IP from one client address, counted across processes (store.py); at most
STREAM_MAX_MESSAGE_CHARS characters in a client message (1009 beyond); at most
STREAM_MESSAGES_PER_SECOND client messages a second (-1003 beyond, 4005 for a client that keeps on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from accounts.models import User
from exchange.api.errors import BadRequest, Disconnected, ListenKeyExpired, TooManyOrders, TooManyRequests
from exchange.api.middleware import client_ip
from streams import relay, watcher
from streams.events import build_events
from streams.selectors import listen_key_owners
from streams.services import STORE_ERRORS, key_group
from streams.store import OVER_KEY_CAP, Lease, connection_lease_seconds, store

logger = logging.getLogger(__name__)

CLOSE_KEY_DEAD = 4001
CLOSE_MAX_AGE = 4002
CLOSE_TOO_MANY_ON_KEY = 4003
CLOSE_TOO_MANY_FROM_IP = 4004
CLOSE_TOO_MANY_MESSAGES = 4005
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_SERVER_ERROR = 1011

# Defaults of the settings (exchange/settings/base.py, docs/streams.md), for settings modules without them.
MAX_CONNECTIONS_PER_KEY = 64
MAX_CONNECTIONS_PER_IP = 100
MAX_MESSAGE_CHARS = 100_000  # a SUBSCRIBE of 1024 listenKeys takes about 66,000
MESSAGES_PER_SECOND = 5.0
# Messages refused for the rate without a quiet second between them, before the connection closes.
REFUSALS_BEFORE_CLOSE = 10


def _setting(name: str, default):
    return getattr(settings, name, default)


def scope_client_ip(scope) -> str | None:
    """The client's address by the gateway's rule (X-Forwarded-For believed only from
    TRUSTED_PROXIES); None when the server does not know the peer (e.g. a unix socket)."""
    client = scope.get("client")
    if not client or not client[0]:
        return None
    meta = {"REMOTE_ADDR": client[0]}
    forwarded = [
        value.decode("latin-1") for name, value in scope.get("headers", ()) if name.lower() == b"x-forwarded-for"
    ]
    if forwarded:
        meta["HTTP_X_FORWARDED_FOR"] = ",".join(forwarded)
    return client_ip(meta)


class TokenBucket:
    """`rate` tokens a second, at most `rate` (at least one) saved up."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@database_sync_to_async
def _owners(keys: list[str]) -> dict[str, int | None]:
    return listen_key_owners(keys)


@database_sync_to_async
def _admit(key: str, lease: Lease) -> tuple[int | None, str | None]:
    """The key's account (None: refused) and, when it has one, the cap the connection would exceed."""
    account = listen_key_owners([key])[key]
    if account is None:
        return None, None
    refusal = store().connection_open(
        lease,
        key_cap=_setting("STREAM_MAX_CONNECTIONS_PER_KEY", MAX_CONNECTIONS_PER_KEY),
        ip_cap=_setting("STREAM_MAX_CONNECTIONS_PER_IP", MAX_CONNECTIONS_PER_IP),
        seconds=connection_lease_seconds(),
    )
    return account, refusal


@database_sync_to_async
def _release(lease: Lease) -> None:
    try:
        store().connection_close(lease)
    except STORE_ERRORS:
        logger.warning("Could not uncount a closed connection; its lease expires by itself")


@database_sync_to_async
def _stream_accounts(account_id: int) -> dict[int, int]:
    """The accounts whose events a key of `account_id` carries (itself, and its sub-accounts when it
    is a whitelisted master), with their current sequence: events up to it are history."""
    accounts = [account_id]
    if User.objects.filter(pk=account_id, is_whitelisted_master=True).exists():
        accounts += list(User.objects.filter(master_id=account_id).values_list("pk", flat=True))
    seqs = relay.current_seqs(accounts)
    return {account: seqs.get(account, 0) for account in accounts}


def _whitelisted_master_of(account_id: int) -> int | None:
    return (
        User.objects.filter(pk=account_id, master__is_whitelisted_master=True)
        .values_list("master_id", flat=True)
        .first()
    )


def _email(account_id: int) -> str:
    return User.objects.filter(pk=account_id).values_list("email", flat=True).first() or ""


class UserDataConsumer(AsyncJsonWebsocketConsumer):
    lease: Lease | None = None  # counted in the caps while set
    closing = False

    async def connect(self) -> None:
        self.primary = self.scope["url_route"]["kwargs"]["listen_key"]
        self.keys: dict[str, int] = {}  # listenKey -> account
        self.last_seq: dict[int, int] = {}  # account whose events we pass on -> last sequence sent
        self.owner_of: dict[int, int] = {}  # account whose events we pass on -> own account that brought it
        self.tasks: list[asyncio.Task] = []
        self.lock = asyncio.Lock()
        self.bucket = TokenBucket(_setting("STREAM_MESSAGES_PER_SECOND", MESSAGES_PER_SECOND))
        self.refusals = 0
        self.refused_at = 0.0
        lease = Lease(connection=self.channel_name, key=self.primary, ip=scope_client_ip(self.scope))
        # Refusals come before the handshake completes (a client sees HTTP 403; the code is ours).
        try:
            account, refusal = await _admit(self.primary, lease)
        except STORE_ERRORS:
            logger.exception("listenKey store unavailable")
            await self.close(code=CLOSE_SERVER_ERROR)
            return
        if account is None:
            await self.close(code=CLOSE_KEY_DEAD)
            return
        if refusal is not None:
            logger.info("Connection refused: too many on its %s", refusal)
            await self.close(code=CLOSE_TOO_MANY_ON_KEY if refusal == OVER_KEY_CAP else CLOSE_TOO_MANY_FROM_IP)
            return
        self.lease = lease
        try:
            await self._add_key(self.primary, account)
            await self.accept()
        except STORE_ERRORS:
            # Redis went away between the admission and joining the groups: refused cleanly (1011,
            # a 403 to the client), never an exception that Daphne answers with HTTP 500.
            logger.warning("Channel layer unavailable while a websocket connected; refused")
            self.lease = None
            await _release(lease)
            await self.close(code=CLOSE_SERVER_ERROR)
            return
        except BaseException:
            self.lease = None
            await _release(lease)
            raise
        relay.ensure_relay()
        watcher.watch(self)  # key expiry, catch-up and the lease, with the process's other connections
        self.tasks = [asyncio.create_task(self._max_age())]

    async def disconnect(self, code) -> None:
        watcher.unwatch(self)
        for task in getattr(self, "tasks", []):
            task.cancel()
        for key in list(getattr(self, "keys", {})):
            await self._drop_key(key)
        lease, self.lease = self.lease, None
        if lease is not None:
            await _release(lease)

    # --- streams -----------------------------------------------------------------------------

    def _account_refs(self, account: int) -> int:
        return sum(1 for owner in self.keys.values() if owner == account)

    async def _add_key(self, key: str, account: int) -> None:
        first_of_account = self._account_refs(account) == 0
        self.keys[key] = account
        await self.channel_layer.group_add(key_group(key), self.channel_name)
        if first_of_account:
            await self.channel_layer.group_add(relay.account_group(account), self.channel_name)
            for watched, seq in (await _stream_accounts(account)).items():
                # From now on: what happened before (or while unsubscribed) is history.
                self.last_seq[watched] = seq
                self.owner_of[watched] = account

    async def _drop_key(self, key: str) -> None:
        account = self.keys.pop(key, None)
        if account is None:
            return
        await self.channel_layer.group_discard(key_group(key), self.channel_name)
        if self._account_refs(account) == 0:
            await self.channel_layer.group_discard(relay.account_group(account), self.channel_name)
            for watched in [w for w, owner in self.owner_of.items() if owner == account]:
                del self.owner_of[watched]
                self.last_seq.pop(watched, None)

    async def receive_json(self, content, **kwargs) -> None:
        request_id = content.get("id") if isinstance(content, dict) else None
        method = content.get("method") if isinstance(content, dict) else None
        params = content.get("params") if isinstance(content, dict) else None
        if (
            method not in ("SUBSCRIBE", "UNSUBSCRIBE")
            or not isinstance(params, list)
            or not all(isinstance(p, str) for p in params)
        ):
            await self._error(
                request_id,
                BadRequest.code,
                "Invalid request: expected SUBSCRIBE or UNSUBSCRIBE with a list of listenKeys in params.",
            )
            return
        if method == "UNSUBSCRIBE":
            for key in params:
                if key != self.primary:
                    await self._drop_key(key)
            await self.send_json({"result": None, "id": request_id})
            return
        new = [key for key in dict.fromkeys(params) if key not in self.keys]
        if len(self.keys) + len(new) > settings.STREAM_MAX_STREAMS_PER_CONNECTION:
            await self._error(
                request_id,
                TooManyOrders.code,
                f"A connection listens to at most {settings.STREAM_MAX_STREAMS_PER_CONNECTION} streams.",
            )
            return
        try:
            owners = await _owners(new) if new else {}  # all of them in one round trip
        except STORE_ERRORS:
            logger.exception("listenKey store unavailable")
            await self._error(request_id, Disconnected.code, Disconnected.message)
            return
        dead = [key for key, owner in owners.items() if owner is None]
        if dead:
            await self._error(request_id, ListenKeyExpired.code, f"This listenKey does not exist: {dead[0]}")
            return
        for key, owner in owners.items():
            await self._add_key(key, owner)
        await self.send_json({"result": None, "id": request_id})

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        if self.closing:
            return
        size = len(text_data) if text_data is not None else len(bytes_data or b"")
        if size > _setting("STREAM_MAX_MESSAGE_CHARS", MAX_MESSAGE_CHARS):
            await self._shut(CLOSE_MESSAGE_TOO_BIG)
            return
        if not self.bucket.take():
            await self._refuse_for_rate()
            return
        try:
            await super().receive(text_data=text_data, bytes_data=bytes_data, **kwargs)
        except ValueError:  # not JSON
            await self._error(None, BadRequest.code, "Invalid request: not JSON.")

    async def _refuse_for_rate(self) -> None:
        """Beyond the rate a message is answered -1003 (unread); a client that keeps on sending
        (REFUSALS_BEFORE_CLOSE refusals without a quiet second between them) is disconnected."""
        now = time.monotonic()
        self.refusals = self.refusals + 1 if now - self.refused_at < 1.0 else 1
        self.refused_at = now
        if self.refusals > REFUSALS_BEFORE_CLOSE:
            await self._shut(CLOSE_TOO_MANY_MESSAGES)
            return
        rate = self.bucket.rate
        await self._error(None, TooManyRequests.code, f"Too many messages; at most {rate:g} per second.")

    async def _error(self, request_id, code: int, msg: str) -> None:
        await self.send_json({"error": {"code": code, "msg": msg}, "id": request_id})

    # --- lifetime ------------------------------------------------------------------------------

    async def catch_up(self, account: int, seq: int) -> None:
        """Backstop for messages the channel layer dropped (a full channel): the watcher saw the
        account's sequence at `seq`, beyond what we sent; read the rest from the change feed."""
        last = self.last_seq.get(account)
        if last is not None and seq > last:
            await self.ledger_changes({"account": account, "rows": [], "email": None, "catch_up_to": seq})

    async def _max_age(self) -> None:
        await asyncio.sleep(settings.STREAM_MAX_CONNECTION_SECONDS)
        await self._shut(CLOSE_MAX_AGE)

    async def key_dead(self, key: str) -> None:
        if key == self.primary:
            await self._shut(CLOSE_KEY_DEAD)
        else:
            await self._drop_key(key)

    async def _shut(self, code: int) -> None:
        """Close once: no further close frames or messages while the client's close handshake runs."""
        if self.closing:
            return
        self.closing = True
        watcher.unwatch(self)
        await self.close(code=code)
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def listenkey_closed(self, event) -> None:
        await self.key_dead(event["key"])

    # --- events --------------------------------------------------------------------------------

    async def ledger_changes(self, message) -> None:
        if self.closing:
            return
        account = message["account"]
        async with self.lock:  # one message at a time, so the sequence check holds
            rows = message["rows"]
            owner = self.owner_of.get(account)
            if owner is None:
                own = set(self.keys.values())
                master = await database_sync_to_async(_whitelisted_master_of)(account)
                if master not in own or not rows:
                    return  # no longer (or never) ours: a key closed while this was in flight
                owner = self.owner_of[account] = master  # a sub-account created after we connected
                self.last_seq[account] = rows[0]["seq"] - 1
            email = None if owner == account else (message["email"] or await database_sync_to_async(_email)(account))
            last = self.last_seq[account]
            fresh = [row for row in rows if row["seq"] > last]
            upto = fresh[-1]["seq"] if fresh else message.get("catch_up_to", last)
            if upto - last > len(fresh):
                # Some rows up to `upto` never reached us, before these or between them (a batch
                # holds the postings handed to the publisher so far, and a concurrent posting's
                # earlier sequence may come in the next batch): read them all from the database.
                fresh = await database_sync_to_async(relay.rows_between)(account, last + 1, upto)
            if not fresh:
                return
            self.last_seq[account] = fresh[-1]["seq"]
            for event in build_events(fresh, email=email):
                with contextlib.suppress(Exception):
                    await self.send_json(event)
