"""The user data stream: /openapi/ws/<listenKey>.

A connection starts with one listenKey and may add more (up to 1024 streams) with
`{"method": "SUBSCRIBE", "params": [...], "id": n}` and remove them with UNSUBSCRIBE; each request
is answered `{"result": null, "id": n}` or `{"error": {"code", "msg"}, "id": n}`. The connection
closes when its first key expires or is closed, and after 24 hours; a further key that dies is
dropped from the connection. Daphne pings idle clients and drops those that do not answer
(--ping-interval / --ping-timeout).

Events come from the process's hub (hub/), which receives each account's messages once for all
the process's connections, keeps their order and builds their frames. On Daphne a connection writes
them straight to its socket, framed once for all (wire.py); on another server it keeps an outbox of
frames that its own sender task writes out. A connection whose oldest frame not yet taken by its
client has waited more than STREAM_MAX_LAG_SECONDS, or with more than STREAM_MAX_PENDING_FRAMES
frames waiting, is closed (4006: too slow, reconnect and resync) rather than falling behind without
bound, and the others on the account go on (checked by the watcher, and at each push to an outbox).

Bounds (docs/streams.md): at most STREAM_MAX_CONNECTIONS_PER_KEY connections on one listenKey and
STREAM_MAX_CONNECTIONS_PER_IP from one client address, counted across processes (store.py); at most
STREAM_MAX_MESSAGE_CHARS characters in a client message (1009 beyond), nested at most 16 levels
deep (-1010 "not JSON" beyond, measured before parsing by exchange/api/jsontext.py); at most
STREAM_MESSAGES_PER_SECOND client messages a second (-1003 beyond, 4005 for a client that keeps on).

However a connection ends (the client's close, ours, or an exception in the consumer), it ends in
one cleanup (`_cleanup`): its place in the caps, its watcher entry, its hub registration and its
tasks are given back (issue 34, finding 6: an exception used to end it with 1011 and no
`disconnect()`, its place counted until restart). An exception is logged and closes it with 1011.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings

from exchange.api import jsontext
from exchange.api.errors import BadRequest, Disconnected, ListenKeyExpired, TooManyOrders, TooManyRequests
from exchange.api.middleware import client_ip
from streams import relay, watcher
from streams.hub import Listener, hub_for, read_accounts
from streams.hub.fairness import max_lag_seconds
from streams.selectors import listen_key_owners
from streams.services import STORE_ERRORS, STORE_OUTAGE
from streams.store import OVER_KEY_CAP, Lease, connection_lease_seconds, store
from streams.wire import Wire, text_frames

logger = logging.getLogger(__name__)

CLOSE_KEY_DEAD = 4001
CLOSE_MAX_AGE = 4002
CLOSE_TOO_MANY_ON_KEY = 4003
CLOSE_TOO_MANY_FROM_IP = 4004
CLOSE_TOO_MANY_MESSAGES = 4005
CLOSE_TOO_SLOW = 4006
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_SERVER_ERROR = 1011

# Defaults of the settings (exchange/settings/base.py, docs/streams.md), for settings modules without them.
MAX_CONNECTIONS_PER_KEY = 64
MAX_CONNECTIONS_PER_IP = 100
MAX_MESSAGE_CHARS = 100_000  # a SUBSCRIBE of 1024 listenKeys takes about 66,000
MESSAGES_PER_SECOND = 5.0
MAX_PENDING_FRAMES = 2000
# Frames a sender task writes before it lets the event loop's other work in.
SEND_SLICE = 256
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
def _read_accounts(account_ids: list[int]):
    """The accounts whose events the keys of `account_ids` carry (themselves, and the sub-accounts
    of whitelisted masters among them), with their current sequence: events up to it are history."""
    return read_accounts(account_ids)


class UserDataConsumer(AsyncJsonWebsocketConsumer):
    lease: Lease | None = None  # counted in the caps while set
    listener: Listener | None = None  # registered with the hub while set
    closing = False
    cleaned = False  # _cleanup ran
    wire: Wire | None = None  # Daphne's socket, written directly (streams/wire.py); else the outbox

    async def __call__(self, scope, receive, send):
        """channels' AsyncConsumer.__call__ without a channel-layer receive of the connection's own:
        nothing is ever sent to a connection's channel (the hub receives for all of the process's
        connections), and that receive (a blocking Redis read per process, a task per connection)
        made every connection end with "Exception inside application" when Redis went away; they
        now end through the hub's failure path (1011) with one log line. The channel name stays the
        connection's unique name (its lease in the caps)."""
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = f"ws.{uuid.uuid4().hex}"
        self.base_send = send
        try:
            await await_many_dispatch([receive], self.dispatch)
        except StopConsumer:
            pass
        except Exception:
            # Whatever failed (a bug, a library's error): logged, the connection closed as a server
            # error, and its places given back below (Daphne would close it 1011 but never call
            # disconnect(), leaving it counted in the caps).
            logger.exception("A websocket connection failed; closing it (1011)")
            with contextlib.suppress(Exception):
                await self.close(code=CLOSE_SERVER_ERROR)
        finally:
            await self._cleanup()

    async def connect(self) -> None:
        self.primary = self.scope["url_route"]["kwargs"]["listen_key"]
        self.tasks: list[asyncio.Task] = []
        self.outbox: deque[str] = deque()
        # (when pushed, frames pushed by then) per push still (partly) in the outbox: its lag.
        self.stamps: deque[tuple[float, int]] = deque()
        self.pushed = 0
        self.sent = 0
        self.wake = asyncio.Event()
        self.bucket = TokenBucket(_setting("STREAM_MESSAGES_PER_SECOND", MESSAGES_PER_SECOND))
        self.refusals = 0
        self.refused_at = 0.0
        self.hub = hub_for(self.channel_layer)
        self.listener = Listener(
            push=self._push, key_closed=self._key_closed, failed=self._failed, too_slow=self._too_slow, lag=self.lag
        )
        self.keys = self.listener.keys  # listenKey -> account, kept by the hub
        lease = Lease(connection=self.channel_name, key=self.primary, ip=scope_client_ip(self.scope))
        # Refusals come before the handshake completes (a client sees HTTP 403; the code is ours).
        try:
            account, refusal = await _admit(self.primary, lease)
        except STORE_ERRORS as exc:
            STORE_OUTAGE.failed(exc)
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
            await self._add_keys({self.primary: account})
            await self.accept()
            self.wire = Wire.of(self.base_send)
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
        watcher.watch(self)  # key expiry and the lease, with the process's other connections
        self.tasks = [asyncio.create_task(self._max_age()), asyncio.create_task(self._send_frames())]

    async def disconnect(self, code) -> None:
        await self._cleanup()

    async def _cleanup(self) -> None:
        """Give back what the connection holds, whichever way it ended (the client's close, an
        exception, a cancellation); a second call does nothing. The lease is returned even if
        something before it fails."""
        if self.cleaned:
            return
        self.cleaned = True
        try:
            watcher.unwatch(self)
            for task in getattr(self, "tasks", ()):
                task.cancel()
            if self.listener is not None:
                self.hub.drop_all(self.listener)
                await self.hub.settle()
        finally:
            lease, self.lease = self.lease, None
            if lease is not None:
                await _release(lease)

    # --- streams -----------------------------------------------------------------------------

    async def _add_keys(self, owners: dict[str, int]) -> None:
        """Listen to more keys: register them with the hub, wait until it is in their groups, then
        read their accounts' sequences (what happened up to them is history) and start there."""
        groups, accounts = self.hub.add_keys(self.listener, owners)
        try:
            await self.hub.joined(groups)
            if accounts:
                self.hub.start(self.listener, await _read_accounts(accounts))
        except BaseException:
            for key in owners:
                self.hub.drop_key(self.listener, key)
            raise

    async def _drop_key(self, key: str) -> None:
        self.hub.drop_key(self.listener, key)

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
        except STORE_ERRORS as exc:
            STORE_OUTAGE.failed(exc)
            await self._error(request_id, Disconnected.code, Disconnected.message)
            return
        dead = [key for key, owner in owners.items() if owner is None]
        if dead:
            await self._error(request_id, ListenKeyExpired.code, f"This listenKey does not exist: {dead[0]}")
            return
        if owners and not self.closing:
            await self._add_keys(owners)
        await self.send_json({"result": None, "id": request_id})

    @classmethod
    async def decode_json(cls, text_data):
        """A client message, measured before it is parsed (exchange/api/jsontext.py): one nested too
        deep is "not JSON" (a ValueError, answered by `receive`) and never reaches the recursive
        parser (issue 34, finding 5)."""
        return jsontext.loads(text_data, max_chars=_setting("STREAM_MAX_MESSAGE_CHARS", MAX_MESSAGE_CHARS))

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
        if not text_data:
            await self._error(None, BadRequest.code, "Invalid request: not JSON.")
            return
        try:
            content = await self.decode_json(text_data)  # bounded before parsing (exchange/api/jsontext.py)
        except ValueError:
            await self._error(None, BadRequest.code, "Invalid request: not JSON.")
            return
        await self.receive_json(content, **kwargs)

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

    # --- events: the hub's frames, to the socket or through the outbox --------------------------

    def _push(self, frames: list[str]) -> None:
        """The hub hands over a posting's frames (it never waits for a connection). On Daphne they
        are written to the socket at once, framed once for all connections (streams/wire.py);
        otherwise they go to the outbox that the connection's sender task writes out."""
        if self.closing:
            return
        wire = self.wire
        if wire is not None:  # its lag is checked by the watcher (a system call: not per frame)
            data = getattr(frames, "wire", None) or text_frames(frames)
            wire.write(data, len(frames))  # False: closing; the close ends the connection
            return
        if self.check_lag(len(frames)):
            return
        self.outbox.extend(frames)
        self.pushed += len(frames)
        self.stamps.append((time.monotonic(), self.pushed))
        self.wake.set()

    def lag(self) -> tuple[float, int]:
        """(seconds the oldest frame not yet written has waited in this server, frames waiting)."""
        if self.wire is not None:
            return self.wire.lag()
        stamps = self.stamps
        while stamps and stamps[0][1] <= self.sent:
            stamps.popleft()
        if not stamps:
            return 0.0, 0
        return time.monotonic() - stamps[0][0], len(self.outbox)

    def check_lag(self, coming: int = 0) -> bool:
        """Close the connection (4006, too slow: reconnect and resync) when its oldest frame not yet
        written has waited more than STREAM_MAX_LAG_SECONDS, or more than STREAM_MAX_PENDING_FRAMES
        would wait with `coming` more: it is cut off rather than silently late, and nothing of it
        slows the account's other connections or the process's other accounts. True: closed."""
        if self.closing or self.listener is None or self.listener.gone:
            return True
        waited, waiting = self.lag()
        max_lag = max_lag_seconds()
        max_frames = _setting("STREAM_MAX_PENDING_FRAMES", MAX_PENDING_FRAMES)
        if waited <= max_lag and waiting + coming <= max_frames:
            return False
        logger.warning(
            "Closing a stream %.1f s and %s frames behind (4006, too slow); its key %s…",
            waited,
            waiting,
            self.primary[:12],
        )
        self._too_slow()
        return True

    def _too_slow(self) -> None:
        if self.closing:
            return
        self.hub.drop_all(self.listener)  # nothing more for it; the others go on
        self._spawn(self._shut(CLOSE_TOO_SLOW, flush=False))

    async def _send_frames(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            sent = 0
            while self.outbox:
                frame = self.outbox.popleft()
                with contextlib.suppress(Exception):
                    await self._send_frame(frame)
                self.sent += 1
                sent += 1
                if sent % SEND_SLICE == 0:
                    await asyncio.sleep(0)

    async def _send_frame(self, frame: str) -> None:
        await self.send(text_data=frame)

    def _key_closed(self, key: str, message: dict) -> None:
        """The hub received the key's close and has already detached it (so nothing sent after the
        close reaches this connection through it); the connection closes or drops the key."""
        if key == self.primary:
            self.hub.drop_all(self.listener)
        else:
            self.hub.drop_key(self.listener, key)
        self._spawn(self.listenkey_closed(message))

    def _failed(self) -> None:
        self.hub.drop_all(self.listener)
        self._spawn(self._shut(CLOSE_SERVER_ERROR))

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.append(task)
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task) -> None:
        with contextlib.suppress(ValueError):
            self.tasks.remove(task)

    # --- lifetime ------------------------------------------------------------------------------

    async def _max_age(self) -> None:
        await asyncio.sleep(settings.STREAM_MAX_CONNECTION_SECONDS)
        await self._shut(CLOSE_MAX_AGE)

    async def key_dead(self, key: str) -> None:
        if key == self.primary:
            await self._shut(CLOSE_KEY_DEAD)
        else:
            await self._drop_key(key)

    async def _shut(self, code: int, *, flush: bool = True) -> None:
        """Close once: no further close frames or messages while the client's close handshake
        runs. The frames already queued go first (not for a connection too slow to take them)."""
        if self.closing:
            return
        self.closing = True
        watcher.unwatch(self)
        self.hub.drop_all(self.listener)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        while flush and self.outbox:
            with contextlib.suppress(Exception):
                await self._send_frame(self.outbox.popleft())
        self.outbox.clear()
        await self.close(code=code)

    async def listenkey_closed(self, event) -> None:
        await self.key_dead(event["key"])
