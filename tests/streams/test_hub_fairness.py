"""The hub's fairness (streams/hub/fairness.py): when the process falls behind, the cost is charged to
what causes it. A connection that does not take its frames is closed first; else an account whose
own postings made most of the hub's work; never a recipient for the money others send it. "Behind"
is measured on one clock (Redis's), so a publisher on a host whose clock is off does not make a hub
look behind.

The first tests drive the hub's fairness meter (`Fairness`) alone, on a clock of the test's, with
listeners of known lag and cost; the others
go through the interfaces: transfers through the signed REST API, websockets through the ASGI
application, a real Redis channel layer, the relay's publisher thread, and a process made too busy
for its hub to keep up (its event loop held 30 ms at a time by other work, as by other connections'
writes), so that the relay's messages genuinely wait in the channel layer."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connections
from django.test import override_settings

from accounts import ledger
from accounts.models import SystemRole
from streams import clock, services
from streams.hub import Fairness, Listener, hub_for
from tests.support.factories import UserFactory, customer
from tests.support.streams import communicator
from tests.support.waiting import until

TOO_SLOW = {"type": "websocket.close", "code": 4006}


# --- the judgement, with listeners of known lag ------------------------------------------------------


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def listener(cut: list, lag: float = 0.0) -> Listener:
    entry = Listener(
        push=lambda frames: None,
        key_closed=lambda key, message: None,
        failed=lambda: None,
        lag=lambda: (lag, 0),
    )
    entry.too_slow = lambda: cut.append(entry)
    return entry


Meter = tuple[Fairness, FakeClock, dict[int, list[Listener]], list[Listener]]


def meter_with(audiences: dict[int, list[float]]) -> Meter:
    """A fairness meter (on a clock of the test's) whose account n has listeners of the given lags."""
    cut: list[Listener] = []
    listeners = {account: [listener(cut, lag) for lag in lags] for account, lags in audiences.items()}
    clock_ = FakeClock()
    meter = Fairness(
        audience=lambda account: listeners.get(account, []),
        everyone=lambda: {entry for entries in listeners.values() for entry in entries},
        clock=clock_,
    )
    return meter, clock_, listeners, cut


def sent(behind: float) -> float:
    return clock.hub.now() - behind


def behind_long_enough(meter: Fairness, clock_: FakeClock) -> None:
    meter.received(sent(1.5))
    clock_.now += 0.6  # late for half the bound: behind (not one pause's backlog)
    meter.received(sent(1.5))


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_on_time_or_late_once_nobody_is_closed():
    meter, _clock, _, cut = meter_with({1: [0.0] * 50, 2: [0.9]})
    meter.charge(1, 5000, 5000)
    meter.received(sent(0.5))
    meter.received(None)  # an older relay: no "sent"
    meter.received(sent(1.5))  # one late message: perhaps one pause's backlog
    assert (cut, meter.sheds) == ([], 0)


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_behind_the_connections_slow_to_take_their_frames_are_closed_first():
    meter, clock_, listeners, cut = meter_with({1: [0.0] * 50, 2: [0.7, 0.1], 3: [0.0]})
    meter.charge(1, 5000, 5000)  # account 1 made all the work itself, but a connection is slow
    behind_long_enough(meter, clock_)
    assert cut == [listeners[2][0]]
    assert meter.sheds == 1


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_behind_an_account_that_made_most_of_the_work_itself_is_closed_once_per_bound():
    meter, clock_, listeners, cut = meter_with({1: [0.0] * 50, 2: [0.0], 3: [0.0] * 5})
    meter.charge(1, 5000, 5000)
    meter.charge(3, 1000, 1000)
    behind_long_enough(meter, clock_)
    assert set(cut) == set(listeners[1])
    clock_.now += 0.5
    meter.received(sent(1.5))  # still behind (the backlog drains): not judged again so soon
    assert meter.sheds == 1


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_behind_a_recipient_of_others_money_is_never_closed():
    # Account 1's 50 connections cost the most, but its postings only credited it (money received):
    # it is not charged; nobody else made half the work either, so nobody is closed.
    meter, clock_, _, cut = meter_with({1: [0.0] * 50, 2: [0.0], 3: [0.0] * 5})
    meter.charge(1, 5000, 0)
    meter.charge(3, 1000, 1000)
    behind_long_enough(meter, clock_)
    assert (cut, meter.sheds) == ([], 0)


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_the_cost_windows_move_on_with_the_clock():
    # Work older than two cost windows is no longer anybody's: account 1's burst two seconds ago
    # does not get it closed now, while account 3's work of the last window does.
    meter, clock_, listeners, cut = meter_with({1: [0.0] * 5, 3: [0.0] * 5})
    meter.charge(1, 5000, 5000)
    clock_.now += 1.0
    meter.charge(3, 10, 10)
    clock_.now += 1.0
    meter.charge(3, 10, 10)
    behind_long_enough(meter, clock_)
    assert set(cut) == set(listeners[3])


def test_what_the_account_caused_itself():
    from streams.hub.fairness import caused_by_holder

    def row(free: str, locked: str = "0") -> dict:
        return {"delta_free": free, "delta_locked": locked}

    assert not caused_by_holder([row("1.5")])  # money received
    assert caused_by_holder([row("-1.5")])  # sent
    assert caused_by_holder([row("-1", "1")])  # held (an order, a withdrawal)
    assert caused_by_holder([row("-100"), row("0.002")])  # a convert: both rows, one posting


# --- through the interfaces ----------------------------------------------------------------------------


@pytest.fixture
def fresh_clocks():
    """The clocks measure their offset again now (a test's skew must not outlive it)."""
    for each in (clock.publisher, clock.hub):
        each.offset, each.synced_at, each.local = 0.0, None, time.time
    yield
    for each in (clock.publisher, clock.hub):
        each.offset, each.synced_at, each.local = 0.0, None, time.time


async def open_ws(key: str):
    ws = communicator(key)
    connected, code = await ws.connect()
    assert connected, code
    return ws


async def closed_4006(ws) -> bool:
    """Whether the server closed this connection 4006 (what it sent so far, not waiting)."""
    while not ws.output_queue.empty():
        if await ws.receive_output() == TOO_SLOW:
            return True
    return False


def transfers(sender, target: str, seconds: float) -> list[int]:
    """P2P transfers of 1 PHP from `sender` to `target` through the REST API for `seconds`, in this
    thread (its own database connection); their HTTP statuses."""
    statuses = []
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            response = sender.client.post(
                "/openapi/transfer/v4/transfers", {"account": "PHP", "target_address": target, "amount": "1"}
            )
            statuses.append(response.status_code)
    finally:
        connections.close_all()
    return statuses


async def while_busy(work, *, hold_seconds: float = 0.03):
    """Run `work` (a blocking function) in a thread while this process's event loop is held
    `hold_seconds` at a time between its turns (the process busy with other work): the hub gets
    fewer turns than messages come, and the relay's messages wait in the channel layer."""
    done = asyncio.Event()

    async def hog() -> None:
        while not done.is_set():
            time.sleep(hold_seconds)  # holding the loop is the point
            await asyncio.sleep(0)

    hogging = asyncio.create_task(hog())
    try:
        return await sync_to_async(work, thread_sensitive=False)()
    finally:
        done.set()
        await hogging


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def saying(self, text: str) -> list[str]:
        return [r.getMessage() for r in self.records if text in r.getMessage()]


@pytest.fixture
def hub_log():
    """What the hub logs (streams.hub does not propagate to the root logger caplog reads)."""
    handler, logger = Records(), logging.getLogger("streams.hub")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_recipient_flooded_with_transfers_keeps_its_connections(settings, assets, hub_log, fresh_clocks):
    """The finding: an outsider sends the victim many small transfers while the process is behind.
    Before, the victim's connections (the costliest fan-out) were closed 4006; now nobody is, and
    the victim receives every transfer."""
    settings.STREAM_MAX_LAG_SECONDS = 0.6
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    victim = await sync_to_async(UserFactory)(email="victim@fair.test")
    outsider = await sync_to_async(customer)(funding={"PHP": "100000"})
    key = await sync_to_async(services.listen_key_start)(account=victim)
    sockets = [await open_ws(key) for _ in range(3)]
    hub = hub_for(get_channel_layer())

    statuses = await while_busy(lambda: transfers(outsider, victim.email, 4.0))
    sent = statuses.count(200)
    assert set(statuses) == {200}, statuses
    assert sent >= 20, "too few transfers to flood anything"
    await until(lambda: hub.fairness.late > 0 and hub_log.saying(" s behind"), what="the hub behind and judging")

    for ws in sockets:
        frees = []
        while len(frees) < sent:
            output = await ws.receive_output(timeout=15)
            assert output != TOO_SLOW, "the recipient's connection was closed (4006) for money others sent it"
            event = json.loads(output["text"])
            if event["e"] == "outboundAccountPosition":
                frees.append(Decimal(event["B"][0]["f"]))
        assert frees == [Decimal(n) for n in range(1, sent + 1)]
        assert not await closed_4006(ws), "the recipient's connection was closed for money sent to it"
        await ws.disconnect()
    assert hub.fairness.sheds == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_account_whose_own_postings_hold_the_process_behind_is_closed(settings, assets, hub_log, fresh_clocks):
    """What fairness is for: an account that makes the work itself (transfers out, on its own three
    connections) while the process is behind is cut off (4006: reconnect and resync); a bystander's
    connection stays."""
    settings.STREAM_MAX_LAG_SECONDS = 0.6
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    busy = await sync_to_async(customer)(funding={"PHP": "100000"})
    payee, bystander = await sync_to_async(UserFactory)(), await sync_to_async(UserFactory)()
    busy_key = await sync_to_async(services.listen_key_start)(account=busy.user)
    bystander_key = await sync_to_async(services.listen_key_start)(account=bystander)
    busy_sockets = [await open_ws(busy_key) for _ in range(3)]
    other = await open_ws(bystander_key)
    hub = hub_for(get_channel_layer())

    stop = threading.Event()

    def until_cut_off() -> list[int]:
        statuses = []
        while not stop.is_set() and len(statuses) < 2000:
            statuses += transfers(busy, payee.email, 0.5)
        return statuses

    async def watch() -> None:
        await until(lambda: hub.fairness.sheds > 0, what="the busy account cut off")
        stop.set()

    watching = asyncio.create_task(watch())
    await while_busy(until_cut_off)
    await watching

    for ws in busy_sockets:
        while (output := await ws.receive_output(timeout=15))["type"] != "websocket.close":
            pass
        assert output == TOO_SLOW
    assert hub_log.saying("whose own postings made")
    assert not await closed_4006(other)
    await other.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_publisher_whose_clock_is_three_seconds_slow_does_not_make_the_hub_behind(
    settings, assets, fresh_clocks
):
    """One clock: the publisher's own clock runs 3 s behind the hub's (another app host, skewed);
    its messages are stamped on Redis's clock, so none looks late and nobody is closed."""
    settings.STREAM_MAX_LAG_SECONDS = 1.0
    clock.publisher.local = lambda: time.time() - 3.0  # the publisher's clock source, skewed
    account = await sync_to_async(UserFactory)()
    key = await sync_to_async(services.listen_key_start)(account=account)
    ws = await open_ws(key)
    hub = hub_for(get_channel_layer())
    await until(lambda: clock.hub.synced_at is not None, what="the hub's clock measured by the watcher")

    def deposits() -> None:
        try:
            world = ledger.system_account_id(SystemRole.WORLD)
            for n in range(1, 41):
                ledger.post(
                    legs=ledger.move(world, account.pk, "BTC", Decimal(n) / 10**8),
                    kind="CHAIN_DEPOSIT",
                    reference=f"skew:{n}",
                )
                time.sleep(0.02)  # a steady trickle over about a second, not one batch
        finally:
            connections.close_all()

    await sync_to_async(deposits, thread_sensitive=False)()
    received = 0
    while received < 40:
        event = await ws.receive_json_from(timeout=15)
        assert event != TOO_SLOW
        received += event["e"] == "outboundAccountPosition"
    assert hub.messages >= 1
    assert hub.fairness.late == 0, f"{hub.fairness.late} of {hub.messages} messages looked more than 1 s late"
    await ws.disconnect()
