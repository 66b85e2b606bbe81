"""The chaos run's timeline: the stack up, listeners, load, the faults in a seeded order, then the
work settled and every unknown outcome resolved."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable

import psycopg

from harness import client
from harness.chaos.checks import account_positions, judge_segment
from harness.chaos.faults import Faults
from harness.chaos.load import Load
from harness.chaos.records import (
    AFTER_SECONDS,
    CLIENTS,
    HUNG_SECONDS,
    LISTENERS,
    SETTLE_SECONDS,
    TRANSFER_QUERY,
    WARMUP_SECONDS,
    Answer,
    Fault,
    Record,
    Segment,
    now,
)
from harness.ports import HOST
from harness.private import Stack


class Chaos:
    """A chaos run: its stack (a Stack: private servers, or the lab's), the record of what it saw,
    its load (made by `start`, on the demo world the stack loaded) and its faults (`faults`, given
    the stack and the load; None on the lab, whose runs bring their own). `drive` is the private run's
    timeline; `listen`, `wind_down` and `resolve_unknown_transfers` are what a run on the lab shares."""

    def __init__(
        self,
        seed: int,
        out,
        stack: Stack,
        faults: Callable[[Stack, Load, random.Random], Faults] | None = Faults,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)  # noqa: S311 - the fault schedule, not a secret
        self.stack = stack
        self.record = Record(seed, out)
        self.make_faults = faults
        self.load: Load | None = None
        self.faults: Faults | None = None

    def start(self) -> None:
        """The stack up with the demo world; the load and the faults on it."""
        world = self.stack.start("chaos", "--json")
        self.load = Load(self.stack, self.record, world)
        if self.make_faults is not None:
            self.faults = self.make_faults(self.stack, self.load, self.rng)
        self.record.say(self.stack.describe())

    def stop(self) -> None:
        self.stack.stop()

    def listen(self, stop: asyncio.Event) -> list[asyncio.Task]:
        """The LISTENERS websocket slots on the peer's listenKey, until `stop`."""
        return [asyncio.create_task(self.load.listener_slot(i + 1, stop)) for i in range(LISTENERS)]

    async def listening(self) -> None:
        """Until every slot has its first connection."""
        while len(self.record.segments) < LISTENERS:
            await asyncio.sleep(0.1)

    async def drive(self) -> None:
        record, load = self.record, self.load
        stopping, listeners_stop = asyncio.Event(), asyncio.Event()
        schedule = self.faults.schedule()
        self.rng.shuffle(schedule)
        record.say("fault order: " + ", ".join(name for name, _ in schedule))
        slots = self.listen(listeners_stop)
        await self.listening()
        record.load_started()
        running = [asyncio.create_task(load.transfer_client(i, stopping)) for i in range(CLIENTS)]
        running.append(asyncio.create_task(load.money_out(stopping)))
        await asyncio.sleep(WARMUP_SECONDS)
        for name, inject in schedule:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            fault = Fault(name)
            record.faults.append(fault)
            record.say(f"fault {len(record.faults)}: {name}")
            await inject(fault)
            record.say(f"fault {len(record.faults)}: {name} over ({'; '.join(fault.steps)})")
            await asyncio.sleep(AFTER_SECONDS)
        stopping.set()
        await asyncio.gather(*running)
        record.load_stopped()
        await self.wind_down(slots, listeners_stop)

    async def wind_down(self, slots: list[asyncio.Task], listeners_stop: asyncio.Event) -> None:
        """After the load: let the listeners catch up with the feed, stop them, settle the work in
        flight and resolve every transfer whose outcome the client did not learn."""
        self.record.say("load stopped; waiting for the feed, the listeners and the work in flight")
        await self.settle_listeners()
        listeners_stop.set()
        await asyncio.gather(*slots)
        await self.settle_work()
        if self.faults is not None:
            await self.faults.settled()
        await self.resolve_unknown_transfers()

    async def settle_listeners(self) -> None:
        last, since = await self.load.peer_seq(), now()
        while now() - since < 1.5:
            await asyncio.sleep(0.2)
            seq = await self.load.peer_seq()
            if seq != last:
                last, since = seq, now()
        self.final_positions = await asyncio.to_thread(self.peer_positions)
        final = self.final_positions[-1] if self.final_positions else {"key": None, "last": 0}

        def caught_up(segment: Segment) -> bool:
            received = segment.feed.received
            return received[-1] == final["key"] if received else segment.seq_lo >= final["last"]

        deadline = now() + 20
        while now() < deadline:
            if all(caught_up(s) for s in self.record.segments if s.closed is None and not s.feed._task.done()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # anything after the last one (a duplicate) would show now

    async def settle_work(self) -> None:
        deadline = now() + SETTLE_SECONDS
        while now() < deadline:
            with contextlib.suppress(psycopg.Error):
                if not any((await self.load.open_work()).values()):
                    return
            await asyncio.sleep(1.0)

    async def resolve_unknown_transfers(self) -> None:
        """Asks the service, as its client would, whether each transfer with an unknown outcome was
        made: GET .../transfers?client_transfer_id= signed by the sender (total_count 0 or 1)."""
        limit = asyncio.Semaphore(4)

        async def ask(answer: Answer) -> None:
            async with limit:
                signer = self.load.signers[answer.role]
                query = signer.signed({"client_transfer_id": answer.ident})
                conn = client.HttpConnection(HOST, self.stack.port)
                try:
                    status, body = await asyncio.wait_for(
                        conn.request("GET", f"{TRANSFER_QUERY}?{query}", {"X-SERVICE-APIKEY": signer.api_key}),
                        HUNG_SECONDS,
                    )
                    if status == 200:
                        self.record.resolved[answer.ident] = int(json.loads(body)["meta"]["total_count"])
                except Exception:  # noqa: BLE001 - unresolved: reported as such
                    self.record.resolved[answer.ident] = None
                finally:
                    await conn.close()

        await asyncio.gather(*[ask(a) for a in self.record.answers if a.kind == "transfer" and a.unknown])

    # --- the feed ---------------------------------------------------------------------------------------

    def peer_positions(self) -> list[dict]:
        return account_positions(self.stack.book, self.load.ids["peer"])

    def judge_segment(self, segment: Segment) -> None:
        judge_segment(self.final_positions, segment)
