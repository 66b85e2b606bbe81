"""Events after ledger postings, field by field: balanceUpdate and outboundAccountPosition for a
deposit, a transfer, a hold, a TRADE posting and a posting over two assets; order over 1,000
postings; a whitelisted master's view of its sub-accounts."""

from __future__ import annotations

import asyncio
import itertools
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from accounts import ledger
from accounts.ledger.models import BalanceChange
from accounts.models import SystemRole
from exchange.api import formatting as fmt
from subaccounts.services import sub_account_create
from tests.support.factories import deposit
from tests.support.streams import connect

BALANCE_UPDATE_FIELDS = {"e", "E", "a", "d", "T", "BS"}
POSITION_FIELDS = {"e", "E", "u", "B"}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def receive(ws, count: int, timeout: float = 3) -> list[dict]:
    return [await ws.receive_json_from(timeout=timeout) for _ in range(count)]


def post(legs, kind: str, reference: str):
    return ledger.post(legs=legs, kind=kind, reference=reference)


def world() -> int:
    return ledger.system_account_id(SystemRole.WORLD)


def change_millis(posting_id: int, account_id: int) -> int:
    return fmt.millis(BalanceChange.objects.filter(posting_id=posting_id, account_id=account_id).first().created_at)


def assert_balance_update(event: dict, *, asset: str, delta: str, kind: str, posting_ms: int) -> None:
    assert set(event) == BALANCE_UPDATE_FIELDS, event
    assert event["e"] == "balanceUpdate"
    assert type(event["E"]) is int
    assert type(event["T"]) is int
    assert event["a"] == asset
    assert event["d"] == delta
    assert type(event["d"]) is str
    assert event["T"] == posting_ms
    assert event["BS"] == kind


def assert_position(event: dict, *, balances: list[dict], posting_ms: int) -> None:
    assert set(event) == POSITION_FIELDS, event
    assert event["e"] == "outboundAccountPosition"
    assert type(event["E"]) is int
    assert type(event["u"]) is int
    assert event["u"] == posting_ms
    assert event["B"] == balances
    for balance in event["B"]:
        assert set(balance) == {"a", "f", "l"}
        assert all(type(value) is str for value in balance.values())


async def test_deposit(master, assets):
    ws = await connect(master)
    result = await sync_to_async(deposit)(master, "1.5")
    update, position = await receive(ws, 2)
    posting_ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_balance_update(update, asset="BTC", delta="1.50000000", kind="CHAIN_DEPOSIT", posting_ms=posting_ms)
    assert_position(position, balances=[{"a": "BTC", "f": "1.50000000", "l": "0.00000000"}], posting_ms=posting_ms)
    # One clock for the events of one posting, close to now.
    assert update["E"] == position["E"]
    assert 0 <= update["E"] - posting_ms < 5000
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_fiat_deposit_uses_the_asset_precision(master, assets):
    ws = await connect(master)
    result = await sync_to_async(deposit)(master, "250.5", "PHP")
    update, position = await receive(ws, 2)
    posting_ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_balance_update(update, asset="PHP", delta="250.50", kind="CHAIN_DEPOSIT", posting_ms=posting_ms)
    assert_position(position, balances=[{"a": "PHP", "f": "250.50", "l": "0.00"}], posting_ms=posting_ms)
    await ws.disconnect()


async def test_transfer_reaches_both_sides(master, make_user, assets):
    other = await sync_to_async(make_user)()
    await sync_to_async(deposit)(master, "5")
    sender = await connect(master)
    receiver = await connect(other)
    result = await sync_to_async(post)(
        ledger.move(master.pk, other.pk, "BTC", Decimal("1.25")), "P2P_TRANSFER", "p2p:1"
    )
    sent = await receive(sender, 2)
    received = await receive(receiver, 2)
    ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_balance_update(sent[0], asset="BTC", delta="-1.25000000", kind="P2P_TRANSFER", posting_ms=ms)
    assert_position(sent[1], balances=[{"a": "BTC", "f": "3.75000000", "l": "0.00000000"}], posting_ms=ms)
    assert_balance_update(received[0], asset="BTC", delta="1.25000000", kind="P2P_TRANSFER", posting_ms=ms)
    assert_position(received[1], balances=[{"a": "BTC", "f": "1.25000000", "l": "0.00000000"}], posting_ms=ms)
    assert await sender.receive_nothing(0.2)
    assert await receiver.receive_nothing(0.2)
    await sender.disconnect()
    await receiver.disconnect()


async def test_hold_sends_a_position_only(master, assets):
    await sync_to_async(deposit)(master, "5")
    ws = await connect(master)
    result = await sync_to_async(post)(ledger.hold(master.pk, "BTC", Decimal("2")), "CHAIN_WITHDRAWAL", "hold:1")
    (position,) = await receive(ws, 1)
    ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_position(position, balances=[{"a": "BTC", "f": "3.00000000", "l": "2.00000000"}], posting_ms=ms)
    assert await ws.receive_nothing(0.3)
    # Paying the held amount out changes the total: a balanceUpdate again.
    result = await sync_to_async(post)(
        ledger.settle(master.pk, await sync_to_async(world)(), "BTC", Decimal("2")), "CHAIN_WITHDRAWAL", "pay:1"
    )
    update, position = await receive(ws, 2)
    ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_balance_update(update, asset="BTC", delta="-2.00000000", kind="CHAIN_WITHDRAWAL", posting_ms=ms)
    assert_position(position, balances=[{"a": "BTC", "f": "3.00000000", "l": "0.00000000"}], posting_ms=ms)
    await ws.disconnect()


async def test_trade_posting_sends_no_balance_update(master, assets):
    ws = await connect(master)
    source = await sync_to_async(world)()
    result = await sync_to_async(post)(ledger.move(source, master.pk, "BTC", Decimal("0.1")), "TRADE", "trade:1")
    (position,) = await receive(ws, 1)
    ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_position(position, balances=[{"a": "BTC", "f": "0.10000000", "l": "0.00000000"}], posting_ms=ms)
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_posting_over_two_assets_sends_one_position(master, assets):
    await sync_to_async(deposit)(master, "2")
    ws = await connect(master)
    source = await sync_to_async(world)()
    legs = [
        ledger.Leg(master.pk, "BTC", Decimal("-1")),
        ledger.Leg(source, "BTC", Decimal("1")),
        ledger.Leg(source, "PHP", Decimal("-3000000")),
        ledger.Leg(master.pk, "PHP", Decimal("3000000")),
    ]
    result = await sync_to_async(post)(legs, "CONVERT", "convert:1")
    btc, php, position = await receive(ws, 3)
    ms = await sync_to_async(change_millis)(result.posting_id, master.pk)
    assert_balance_update(btc, asset="BTC", delta="-1.00000000", kind="CONVERT", posting_ms=ms)
    assert_balance_update(php, asset="PHP", delta="3000000.00", kind="CONVERT", posting_ms=ms)
    assert_position(
        position,
        balances=[{"a": "BTC", "f": "1.00000000", "l": "0.00000000"}, {"a": "PHP", "f": "3000000.00", "l": "0.00"}],
        posting_ms=ms,
    )
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_order_preserved_over_1000_postings(master, assets):
    """1,000 deposits of increasing amounts, posted by four threads at once (so the fast-path sends
    of consecutive postings race each other): every outboundAccountPosition arrives, in sequence
    order, so the free balance grows strictly."""
    count, threads = 1000, 4
    ws = await connect(master)

    def post_share(first: int):
        try:
            for n in range(first, count + 1, threads):
                deposit(master, f"0.000{n:05d}", reference=f"order:{n}")
        finally:
            connection.close()

    # Worker threads of their own (not the thread-sensitive one the consumer's database calls
    # use); their fast-path sends run on this event loop.
    posters = asyncio.gather(*(sync_to_async(post_share, thread_sensitive=False)(i + 1) for i in range(threads)))
    frees = []
    try:
        while len(frees) < count:
            event = await ws.receive_json_from(timeout=10)
            if event["e"] == "outboundAccountPosition":
                frees.append(event["B"][0]["f"])
    finally:
        await posters
    assert len(frees) == count
    values = [Decimal(f) for f in frees]
    assert all(a < b for a, b in itertools.pairwise(values))
    # Deposit n adds n units of 1e-8: the total after all of them is n(n+1)/2 units.
    assert values[-1] == Decimal(count * (count + 1) // 2) / Decimal(10**8)
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


# --- a master's view of its sub-accounts -----------------------------------------------------------


async def test_a_virtual_sub_account_is_em_by_the_e_mail_its_master_named_it_with(make_user, assets):
    """Issue 34: the master knows the sub-account by the e-mail it gave at creation (the address in
    the reserved space is the account's own, never shown to the family)."""
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    sub = await sync_to_async(sub_account_create)(master=boss, email="Desk@Corp.example")
    ws = await connect(boss)
    await sync_to_async(deposit)(sub, "0.5")
    update, position = await receive(ws, 2)
    assert update["em"] == position["em"] == "Desk@Corp.example"
    await ws.disconnect()


async def test_whitelisted_master_receives_sub_account_events_with_em(make_user, assets):
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    sub = await sync_to_async(make_user)(master=boss)
    ws = await connect(boss)

    result = await sync_to_async(deposit)(sub, "0.5")
    update, position = await receive(ws, 2)
    ms = await sync_to_async(change_millis)(result.posting_id, sub.pk)
    assert set(update) == BALANCE_UPDATE_FIELDS | {"em", "BI"}
    assert update["em"] == sub.email
    assert update["BI"] == str(result.posting_id)
    assert type(update["BI"]) is str
    assert_balance_update(
        {k: v for k, v in update.items() if k not in ("em", "BI")},
        asset="BTC",
        delta="0.50000000",
        kind="CHAIN_DEPOSIT",
        posting_ms=ms,
    )
    assert set(position) == POSITION_FIELDS | {"em"}
    assert position["em"] == sub.email
    assert_position(
        {k: v for k, v in position.items() if k != "em"},
        balances=[{"a": "BTC", "f": "0.50000000", "l": "0.00000000"}],
        posting_ms=ms,
    )

    # The master's own events carry no em.
    result = await sync_to_async(deposit)(boss, "2")
    update, position = await receive(ws, 2)
    ms = await sync_to_async(change_millis)(result.posting_id, boss.pk)
    assert_balance_update(update, asset="BTC", delta="2.00000000", kind="CHAIN_DEPOSIT", posting_ms=ms)
    assert_position(position, balances=[{"a": "BTC", "f": "2.00000000", "l": "0.00000000"}], posting_ms=ms)

    # A transfer from master to sub: both sides, the sub's with em.
    result = await sync_to_async(post)(ledger.move(boss.pk, sub.pk, "BTC", Decimal("1")), "P2P_TRANSFER", "m2s:1")
    events = await receive(ws, 4)
    own = [e for e in events if "em" not in e]
    subs = [e for e in events if "em" in e]
    assert [e["e"] for e in own] == ["balanceUpdate", "outboundAccountPosition"]
    assert [e["e"] for e in subs] == ["balanceUpdate", "outboundAccountPosition"]
    assert own[0]["d"] == "-1.00000000"
    assert own[1]["B"] == [{"a": "BTC", "f": "1.00000000", "l": "0.00000000"}]
    assert subs[0]["d"] == "1.00000000"
    assert subs[0]["BI"] == str(result.posting_id)
    assert subs[1]["B"] == [{"a": "BTC", "f": "1.50000000", "l": "0.00000000"}]
    assert {e["em"] for e in subs} == {sub.email}
    assert await ws.receive_nothing(0.3)
    await ws.disconnect()


async def test_sub_account_created_after_connecting_is_seen(make_user, assets):
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    ws = await connect(boss)
    sub = await sync_to_async(make_user)(master=boss)
    await sync_to_async(deposit)(sub, "0.25")
    update, position = await receive(ws, 2)
    assert update["em"] == sub.email
    assert update["d"] == "0.25000000"
    assert position["em"] == sub.email
    assert position["B"] == [{"a": "BTC", "f": "0.25000000", "l": "0.00000000"}]
    await ws.disconnect()


async def test_master_not_whitelisted_receives_nothing_of_its_subs(make_user, assets):
    boss = await sync_to_async(make_user)()
    sub = await sync_to_async(make_user)(master=boss)
    ws = await connect(boss)
    await sync_to_async(deposit)(sub, "0.5")
    assert await ws.receive_nothing(0.5)
    # The connection itself works: the master's own deposit arrives.
    await sync_to_async(deposit)(boss, "1")
    update, position = await receive(ws, 2)
    assert update["d"] == "1.00000000"
    assert "em" not in update
    assert "em" not in position
    await ws.disconnect()


async def test_sub_account_listener_gets_its_own_events_without_em(make_user, assets):
    boss = await sync_to_async(make_user)(is_whitelisted_master=True)
    sub = await sync_to_async(make_user)(master=boss)
    ws = await connect(sub)
    await sync_to_async(deposit)(sub, "0.5")
    update, position = await receive(ws, 2)
    assert set(update) == BALANCE_UPDATE_FIELDS
    assert set(position) == POSITION_FIELDS
    # The master's own events do not reach the sub.
    await sync_to_async(deposit)(boss, "1")
    assert await ws.receive_nothing(0.5)
    await ws.disconnect()
