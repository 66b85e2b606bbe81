"""The sweeper: an asyncio task in each server process that publishes the change-feed rows still
unpublished after STREAM_SWEEP_GRACE_SECONDS (a process that crashed between commit and publish,
or another process in the embedded default), every STREAM_SWEEP_SECONDS."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections

from exchange.runtime.outage import Outage
from streams.relay.fast_path import remember_server_loop
from streams.relay.feed import mark_published, unpublished

logger = logging.getLogger(__name__)
# Fails every STREAM_SWEEP_SECONDS while Redis or the database is away: logged once, then every 10 s.
SWEEP_OUTAGE = Outage(logger, "Relay sweep failed; retrying")

_sweeper: asyncio.Task | None = None


async def sweep_once(grace_seconds: float | None = None) -> int:
    grace = settings.STREAM_SWEEP_GRACE_SECONDS if grace_seconds is None else grace_seconds
    ids, messages = await database_sync_to_async(unpublished)(grace)
    layer = get_channel_layer()
    for group, message in messages:
        await layer.group_send(group, message)
    if ids:
        await database_sync_to_async(mark_published)(ids)
    return len(ids)


async def _sweep_forever() -> None:
    while True:
        try:
            await sweep_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged by the Outage; the next sweep retries
            SWEEP_OUTAGE.failed(exc)
            await database_sync_to_async(close_old_connections)()
        else:
            SWEEP_OUTAGE.ok()
        await asyncio.sleep(settings.STREAM_SWEEP_SECONDS)


def ensure_relay() -> None:
    """In the server's event loop (called when a websocket connects): remember the loop (the
    in-memory layer's sends must run there) and, unless disabled, start its sweeper (once per loop)."""
    global _sweeper
    loop = asyncio.get_running_loop()
    remember_server_loop(loop)
    if settings.STREAM_SWEEPER_ENABLED and (_sweeper is None or _sweeper.done() or _sweeper.get_loop() is not loop):
        _sweeper = loop.create_task(_sweep_forever())
