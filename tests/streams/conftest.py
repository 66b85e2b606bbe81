from decimal import Decimal

import pytest
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


def communicator(listen_key: str) -> WebsocketCommunicator:
    from exchange.asgi import application

    return WebsocketCommunicator(application, f"/openapi/ws/{listen_key}")
