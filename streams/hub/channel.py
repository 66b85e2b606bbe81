"""The hub's one channel-layer channel: reference-counted group membership, the receive loop that
hands each message to the hub, and the hub's background tasks (their failures logged as outages)."""

from __future__ import annotations

import asyncio
import logging

from exchange.runtime.outage import Outage

# The hub's log records keep the package's name (streams.hub), whichever of its modules logs.
logger = logging.getLogger(__package__)

RETRY_SECONDS = 1.0  # after a failed database read


class ChannelMixin:
    """The Hub's channel-layer side; state (`channel`, `refs`, `members`, `reconciling`, `receiver`,
    `tasks`) is set up in Hub.__init__ (streams/hub/__init__.py)."""

    layer: object
    loop: asyncio.AbstractEventLoop
    channel: str | None
    refs: dict[str, int]
    members: set[str]
    reconciling: dict[str, asyncio.Task]
    receiver: asyncio.Task | None
    tasks: set[asyncio.Task]

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

    async def _refresh_groups(self) -> None:
        """Group memberships expire (the layer's group_expiry, a day): a hub that stays in a group
        for longer, one connection after the other, joins it again now and then."""
        channel = await self._channel()
        for group in list(self.members):
            if group in self.refs:
                await self.layer.group_add(group, channel)

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


def cancelling() -> bool:
    """Whether the current task has been asked to stop (Task.cancelling: Python 3.11+)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
