"""The chaos run's timeline: the stack up, listeners, load, the faults in a seeded order, then the
work settled and every unknown outcome resolved."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

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
    Segment,
    now,
)
from harness.ports import HOST
from harness.private import PrivateStack


class Chaos(Faults, Load, PrivateStack):
    async def drive(self) -> None:
        self.background: list[asyncio.Task] = []
        stopping, listeners_stop = asyncio.Event(), asyncio.Event()
        schedule = [
            ("redis_restart", self.fault_redis),
            ("postgres_restart", self.fault_postgres),
            ("worker_children_kill", self.fault_worker_children),
            ("worker_kill", self.fault_worker_whole),
        ]
        self.rng.shuffle(schedule)
        self.say("fault order: " + ", ".join(name for name, _ in schedule))
        slots = [asyncio.create_task(self.listener_slot(i + 1, listeners_stop)) for i in range(LISTENERS)]
        while len(self.segments) < LISTENERS:
            await asyncio.sleep(0.1)
        self.t0, self.t0_clock = now(), time.strftime("%H:%M:%S")
        load = [asyncio.create_task(self.transfer_client(i, stopping)) for i in range(CLIENTS)]
        load.append(asyncio.create_task(self.money_out(stopping)))
        await asyncio.sleep(WARMUP_SECONDS)
        for name, inject in schedule:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            fault = Fault(name)
            self.faults.append(fault)
            self.say(f"fault {len(self.faults)}: {name}")
            await inject(fault)
            self.say(f"fault {len(self.faults)}: {name} over ({'; '.join(fault.steps)})")
            await asyncio.sleep(AFTER_SECONDS)
        stopping.set()
        await asyncio.gather(*load)
        self.load_end = now()
        await self.wind_down(slots, listeners_stop)

    async def wind_down(self, slots: list[asyncio.Task], listeners_stop: asyncio.Event) -> None:
        """After the load: let the listeners catch up with the feed, stop them, settle the work in
        flight and resolve every transfer whose outcome the client did not learn."""
        self.say("load stopped; waiting for the feed, the listeners and the work in flight")
        await self.settle_listeners()
        listeners_stop.set()
        await asyncio.gather(*slots)
        await self.settle_work()
        await asyncio.gather(*self.background, return_exceptions=True)
        await self.resolve_unknown_transfers()

    async def settle_listeners(self) -> None:
        last, since = await self.peer_seq(), now()
        while now() - since < 1.5:
            await asyncio.sleep(0.2)
            seq = await self.peer_seq()
            if seq != last:
                last, since = seq, now()
        self.final_positions = await asyncio.to_thread(self.peer_positions)
        final = self.final_positions[-1] if self.final_positions else {"key": None, "last": 0}

        def caught_up(segment: Segment) -> bool:
            received = segment.feed.received
            return received[-1] == final["key"] if received else segment.seq_lo >= final["last"]

        deadline = now() + 20
        while now() < deadline:
            if all(caught_up(s) for s in self.segments if s.closed is None and not s.feed._task.done()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # anything after the last one (a duplicate) would show now

    async def settle_work(self) -> None:
        deadline = now() + SETTLE_SECONDS
        while now() < deadline:
            with contextlib.suppress(psycopg.Error):
                if not any((await self.open_work()).values()):
                    return
            await asyncio.sleep(1.0)

    async def resolve_unknown_transfers(self) -> None:
        """Asks the service, as its client would, whether each transfer with an unknown outcome was
        made: GET .../transfers?client_transfer_id= signed by the sender (total_count 0 or 1)."""
        self.resolved: dict[str, int | None] = {}
        limit = asyncio.Semaphore(4)

        async def ask(answer: Answer) -> None:
            async with limit:
                signer = self.signers[answer.role]
                query = signer.signed({"client_transfer_id": answer.ident})
                conn = client.HttpConnection(HOST, self.port)
                try:
                    status, body = await asyncio.wait_for(
                        conn.request("GET", f"{TRANSFER_QUERY}?{query}", {"X-SERVICE-APIKEY": signer.api_key}),
                        HUNG_SECONDS,
                    )
                    if status == 200:
                        self.resolved[answer.ident] = int(json.loads(body)["meta"]["total_count"])
                except Exception:  # noqa: BLE001 - unresolved: reported as such
                    self.resolved[answer.ident] = None
                finally:
                    await conn.close()

        await asyncio.gather(*[ask(a) for a in self.answers if a.kind == "transfer" and a.unknown])

    # --- the feed ---------------------------------------------------------------------------------------

    def peer_positions(self) -> list[dict]:
        return account_positions(self.book, self.ids["peer"])

    def judge_segment(self, segment: Segment) -> None:
        judge_segment(self.final_positions, segment)


# --- the feed, judged ---------------------------------------------------------------------------------
