"""The user data stream in-process: websocket test clients of the ASGI application, and postings
made from several threads at once."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from accounts import ledger
from tests.support.waiting import recording


def communicator(listen_key: str, client: str | None = None, headers=None, sent=None) -> WebsocketCommunicator:
    """A test client of /openapi/ws/<listen_key>; `client`: the peer address the server sees (none
    by default, as on a unix socket: not counted per IP); `sent`: a tests.support.waiting.Sent that
    records when the server sent each message."""
    from exchange.asgi import application

    if sent is not None:
        application = recording(application, sent)
    ws = WebsocketCommunicator(application, f"/openapi/ws/{listen_key}", headers=headers)
    if client is not None:
        ws.scope["client"] = [client, 50000]
    return ws


async def connect(user):
    """A connected communicator on a new listenKey of `user`."""
    from streams import services

    key = await sync_to_async(services.listen_key_start)(account=user)
    ws = communicator(key)
    connected, _ = await ws.connect()
    assert connected
    return ws


def deposit_from_threads(world: int, account_of, count: int, threads: int, prefix: str):
    """Deposits 1..count satoshi (deposit n to `account_of(n)`), from `threads` threads at once, each
    on its own database connection; an awaitable that ends when all are posted."""

    def share(first: int) -> None:
        from django.db import connection

        try:
            for n in range(first, count + 1, threads):
                ledger.post(
                    legs=ledger.move(world, account_of(n).pk, "BTC", Decimal(n) / 10**8),
                    kind="CHAIN_DEPOSIT",
                    reference=f"{prefix}:{n}",
                )
        finally:
            connection.close()

    return asyncio.gather(*(sync_to_async(share, thread_sensitive=False)(i + 1) for i in range(threads)))


def forget_listen_keys() -> None:
    """Account ids start again in every new test database while Redis keeps the listenKeys of
    earlier runs (`streams:active:<account id>`): forget them, or POST returns a stale key."""
    from django.conf import settings

    if not settings.REDIS_URL:
        return
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter("streams:*", count=1000))
    if keys:
        client.delete(*keys)
