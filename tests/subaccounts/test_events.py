"""A universal transfer is one posting, so both sides get their user-data-stream events (issue 15,
item 4), with BS VIRTUAL_DISTRIBUTE; a whitelisted master also gets its sub-account's, with em and BI."""

from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async

from subaccounts import services
from tests.support.factories import AssetFactory, UserFactory, fund
from tests.support.streams import connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def receive(ws, count: int, timeout: float = 3) -> list[dict]:
    return [await ws.receive_json_from(timeout=timeout) for _ in range(count)]


def family():
    AssetFactory(code="BTC")
    boss = UserFactory(email="ev-master@test.example", is_whitelisted_master=True)
    sub = UserFactory(email="ev-sub@test.example", master=boss, is_virtual=True)
    fund(boss, "BTC", "1")
    return boss, sub


async def test_both_sides_get_events_and_the_whitelisted_master_sees_its_sub_accounts(db):
    boss, sub = await sync_to_async(family)()
    master_ws = await connect(boss)
    sub_ws = await connect(sub)
    transfer = await sync_to_async(services.universal_transfer)(
        master=boss, from_email=None, to_email=sub.email, asset_code="BTC", amount=Decimal("0.25"), client_tran_id="ev"
    )
    events = await receive(master_ws, 4)
    own = [e for e in events if "em" not in e]
    subs = [e for e in events if "em" in e]
    assert [e["e"] for e in own] == ["balanceUpdate", "outboundAccountPosition"]
    assert (own[0]["d"], own[0]["BS"]) == ("-0.25000000", "VIRTUAL_DISTRIBUTE")
    assert [e["e"] for e in subs] == ["balanceUpdate", "outboundAccountPosition"]
    assert (subs[0]["em"], subs[0]["BI"], subs[0]["d"]) == (sub.email, str(transfer.posting_id), "0.25000000")
    update, position = await receive(sub_ws, 2)
    assert (update["e"], update["d"], update["BS"]) == ("balanceUpdate", "0.25000000", "VIRTUAL_DISTRIBUTE")
    assert "em" not in update
    assert position["B"] == [{"a": "BTC", "f": "0.25000000", "l": "0.00000000"}]
    await master_ws.disconnect()
    await sub_ws.disconnect()
