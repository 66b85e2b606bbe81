import asyncio
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from accounts import ledger
from accounts.models import Asset, SystemRole


@pytest.fixture
def assets(db):
    Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8)
    Asset.objects.create(code="PHP", name="Philippine peso", transfer_precision=2, is_fiat=True)


def deposit(user, amount, asset="BTC", reference=None):
    world = ledger.system_account_id(SystemRole.WORLD)
    return ledger.post(
        legs=ledger.move(world, user.id, asset, Decimal(amount)),
        kind="CHAIN_DEPOSIT",
        reference=reference or f"dep:{user.id}:{amount}:{asset}:{id(object())}",
    )


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


def communicator(listen_key: str, client: str | None = None, headers=None) -> WebsocketCommunicator:
    """A test client of /openapi/ws/<listen_key>; `client`: the peer address the server sees (none
    by default, as on a unix socket: not counted per IP)."""
    from exchange.asgi import application

    ws = WebsocketCommunicator(application, f"/openapi/ws/{listen_key}", headers=headers)
    if client is not None:
        ws.scope["client"] = [client, 50000]
    return ws


@pytest.fixture(autouse=True)
def _fresh_listen_keys():
    """Account ids start again in every new test database while Redis keeps the listenKeys of
    earlier runs (`streams:active:<account id>`): forget them, or POST returns a stale key."""
    from streams.store import store

    redis = getattr(store(), "redis", None)
    if redis is not None:
        for pattern in ("streams:lk:*", "streams:active:*", "streams:conns:*"):
            for name in redis.scan_iter(pattern):
                redis.delete(name)


async def connect(user):
    """A connected communicator on a new listenKey of `user`."""
    from streams import services

    key = await sync_to_async(services.listen_key_start)(account=user)
    ws = communicator(key)
    connected, _ = await ws.connect()
    assert connected
    return ws
