"""The hub's one channel-layer channel (`Channel`): reference-counted group membership, the receive
loop that hands each message to the hub, the periodic renewal of the memberships, and the hub's
background tasks (their failures logged as outages)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine

from exchange.runtime.outage import Outage

# The hub's log records keep the package's name (streams.hub), whichever of its modules logs.
logger = logging.getLogger(__package__)

RETRY_SECONDS = 1.0  # after a failed database read


class Channel:
    """The channel, its groups and its tasks. `handle(message)` is given every message received;
    `clock` (monotonic seconds) times the renewal of the memberships."""

    def __init__(
        self,
        layer,
        loop: asyncio.AbstractEventLoop,
        handle: Callable[[dict], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layer = layer
        self.loop = loop
        self.handle = handle
        self.clock = clock
        self.name: str | None = None  # the channel's name, once made
        self.receiver: asyncio.Task | None = None
        self._refs: dict[str, int] = {}  # group -> registrations that need it
        self._members: set[str] = set()  # groups the channel is in
        self._reconciling: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._refreshed_at = clock()  # group memberships last renewed

    # --- group membership -----------------------------------------------------------------------

    def ref(self, group: str, delta: int) -> str:
        """One registration more (+1) or less (-1) needs `group`; the channel joins or leaves it."""
        count = self._refs.get(group, 0) + delta
        if count > 0:
            self._refs[group] = count
        else:
            self._refs.pop(group, None)
        if (group in self._refs) != (group in self._members) and group not in self._reconciling:
            self._reconcile_soon(group)
        return group

    async def joined(self, groups: list[str]) -> None:
        """Until the channel is in these groups (raises what joining raised)."""
        for group in groups:
            while group in self._refs and group not in self._members:
                task = self._reconciling.get(group) or self._reconcile_soon(group)
                await asyncio.shield(task)

    def needed(self) -> bool:
        """Whether any registration needs a group (or a join or leave is under way)."""
        return bool(self._refs or self._reconciling)

    async def settle(self) -> None:
        """Until the joins and leaves under way are done."""
        for task in list(self._reconciling.values()):
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def _reconcile_soon(self, group: str) -> asyncio.Task:
        task = self._reconciling[group] = self.loop.create_task(self._reconcile(group))
        task.add_done_callback(_retrieve)
        return task

    async def _reconcile(self, group: str) -> None:
        """Join or leave `group` until membership matches the registrations (they may change while
        a call is under way)."""
        try:
            channel = await self._channel()
            while (group in self._refs) != (group in self._members):
                if group in self._refs:
                    await self.layer.group_add(group, channel)
                    self._members.add(group)
                else:
                    self._members.discard(group)
                    await self.layer.group_discard(group, channel)
        finally:
            if self._reconciling.get(group) is asyncio.current_task():
                del self._reconciling[group]

    async def _channel(self) -> str:
        if self.name is None:
            self.name = await self.layer.new_channel()  # no I/O in either layer
        return self.name

    def maintain(self) -> asyncio.Task | None:
        """Group memberships expire (the layer's group_expiry, a day): a channel that stays in a
        group for longer, one connection after the other, joins it again now and then. Returns the
        renewal if one is due."""
        now = self.clock()
        if now - self._refreshed_at > min(3600.0, getattr(self.layer, "group_expiry", 86400) / 4):
            self._refreshed_at = now
            return self.spawn(self._refresh_groups())
        return None

    async def _refresh_groups(self) -> None:
        channel = await self._channel()
        for group in list(self._members):
            if group in self._refs:
                await self.layer.group_add(group, channel)

    # --- receiving ---------------------------------------------------------------------------------

    def receive(self) -> None:
        """Receive (if not already): each message goes to `handle`."""
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
                self.handle(message)
            except Exception:
                logger.exception("The stream hub could not handle a %s message", message.get("type"))

    # --- background work -------------------------------------------------------------------------

    def spawn(self, coroutine: Coroutine) -> asyncio.Task:
        """Run `coroutine` in the background (cancelled by `stop`; a failure is logged)."""
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)
        return task

    def stop(self) -> None:
        """Cancel the background tasks and stop receiving."""
        for task in list(self._tasks):
            task.cancel()
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            # Not awaited: channels_redis may take until its blocking read times out to let go of
            # a cancelled receive (as with the consumers' own receives, which nobody awaits either).
            receiver.cancel()


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        TASK_OUTAGE.failed(task.exception())  # a Redis outage fails many at once: logged once, then every 10 s


TASK_OUTAGE = Outage(logger, "Stream hub task failed")
RECEIVE_OUTAGE = Outage(logger, "The stream hub could not receive; retrying", settle=0.0)


def cancelling() -> bool:
    """Whether the current task has been asked to stop (Task.cancelling: Python 3.11+)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
