"""The simulation's infrastructure faults on a seeded timeline, and every customer's websocket on its
listenKey."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal

import psycopg

from harness.chaos.records import PositionFeed, Segment, now
from harness.ports import HOST
from harness.private import Stack, process_children
from harness.simulation.world import Customers, SimRecord


class Faults:
    """A simulation's faults on the `stack` at the times of `fault_plan` ([(seconds after the start,
    name)]), and every customer's websocket on its listenKey (`accounts`' calls); both recorded in the
    `record`. The lab's (simulation/lab.py: LabFaults) adds its own faults."""

    def __init__(self, stack: Stack, accounts: Customers, record: SimRecord, fault_plan: list) -> None:
        self.stack, self.accounts, self.record, self.fault_plan = stack, accounts, record, fault_plan

    # --- faults ----------------------------------------------------------------------------------------------

    async def fault(self, name: str) -> dict:
        fault = {"name": name, "start": now(), "steps": []}
        draw = self.record.seed + len(self.record.faults)
        away = random.Random(draw).uniform(2.0, 5.0)  # noqa: S311 - restarts: seconds away
        if name == "redis_restart":
            await asyncio.to_thread(self.stack.redis.stop)
            await asyncio.sleep(away)
            await asyncio.to_thread(self.stack.redis.start)
            fault["steps"].append("Redis SHUTDOWN, started again on its AOF")
        elif name == "postgres_restart":
            await asyncio.to_thread(self.stack.pg.stop, "fast")
            await asyncio.sleep(away)
            await asyncio.to_thread(self.stack.pg.start)
            fault["steps"].append("pg_ctl stop -m fast, started again")
        elif name == "connections_dropped":
            killed = 0
            for _ in range(60):  # for 3 s: whatever is inside a transaction then
                rows = await asyncio.to_thread(
                    self.stack.book.rows,
                    # The run's own database, whichever it is (the private "sim", the lab's).
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    " AND (state LIKE 'idle in transaction%%' OR (state = 'active' AND xact_start IS NOT NULL))",
                )
                killed += rows[0][0]
                await asyncio.sleep(0.05)
            fault["steps"].append(f"pg_terminate_backend: {killed} connections in a transaction dropped")
        elif name == "worker_kill":
            program = self.worker_program()
            old = self.stack.supervisor.pid(program)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old, signal.SIGKILL)
            while self.stack.supervisor.pid(program) in (0, old) and now() - fault["start"] < 60:
                await asyncio.sleep(0.2)  # supervisord starts it again
            fault["steps"].append(
                f"SIGKILL to the whole worker {program} ({old}); started again as {self.stack.supervisor.pid(program)}"
            )
        elif name == "worker_children_kill":
            program = self.worker_program()
            children = process_children(self.stack.supervisor.pid(program))
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            fault["steps"].append(f"SIGKILL to {program}'s pool children {children}")
        fault["end"] = now()
        return fault

    def worker_program(self) -> str:
        """The supervisord program the worker faults hit."""
        return "worker"

    async def faults_timeline(self, stopping: asyncio.Event) -> None:
        for at, name in self.fault_plan:
            await asyncio.sleep(max(0.0, self.record.t0 + at - now()))
            if stopping.is_set():
                return
            self.record.say(f"fault {len(self.record.faults) + 1}: {name}")
            fault = await self.fault(name)
            self.record.faults.append(fault)
            self.record.say(
                f"fault {len(self.record.faults)}: {name} over in {fault['end'] - fault['start']:.1f} s "
                f"({'; '.join(fault['steps'])})"
            )

    # --- websockets ----------------------------------------------------------------------------------------------

    async def seq_of(self, who: str) -> int:
        while True:
            try:
                rows = await asyncio.to_thread(
                    self.stack.book.rows,
                    "SELECT seq FROM accounts_ledgeraccount WHERE user_id = %s",
                    [self.accounts.ids[who]],
                )
                return rows[0][0]
            except psycopg.Error:
                await asyncio.sleep(0.5)

    async def listener(self, who: str, stop: asyncio.Event) -> None:
        """One websocket on the customer's listenKey for the whole run; again whenever the server closes it."""
        while not stop.is_set():
            lo = await self.seq_of(who)
            answer, data = await self.accounts.call(who, "listen_key", {}, kind="listenkey")
            if answer.status != 200:
                await asyncio.sleep(0.5)
                continue
            feed = PositionFeed(f"ws://{HOST}:{self.stack.port}/openapi/ws/{data['listenKey']}")
            try:
                await feed.start()
            except Exception:  # noqa: BLE001 - refused at the handshake or unreachable: again
                await asyncio.sleep(0.5)
                continue
            segment = Segment(int(who[1:]), lo, await self.seq_of(who), now(), feed, account=who)
            self.record.segments.append(segment)
            if await segment.watch(stop):
                await asyncio.sleep(0.2)
                continue
            await feed.stop()
