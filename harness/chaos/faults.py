"""The chaos run's faults: Redis and PostgreSQL restarted, the Celery worker's pool children and the
whole worker SIGKILLed with work in flight, and how long the work then took to settle."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import Awaitable, Callable

import psycopg

from harness.chaos.load import Load
from harness.chaos.records import SETTLE_SECONDS, Fault, now
from harness.private import PrivateStack, process_children


class Faults:
    """The faults of a chaos run on a PrivateStack (`stack`: its `redis` and `pg` restarted, its worker
    killed), with `load`'s burst of work before a kill and its open work read after; `rng` draws the
    times away. What settles after a kill is tracked in the `background`, awaited by `settled`."""

    def __init__(self, stack: PrivateStack, load: Load, rng: random.Random) -> None:
        self.stack, self.load, self.rng = stack, load, rng
        self.background: list[asyncio.Task] = []

    def schedule(self) -> list[tuple[str, Callable[[Fault], Awaitable[None]]]]:
        """The four faults, by name, in a fixed order (the run shuffles it with the seed)."""
        return [
            ("redis_restart", self.fault_redis),
            ("postgres_restart", self.fault_postgres),
            ("worker_children_kill", self.fault_worker_children),
            ("worker_kill", self.fault_worker_whole),
        ]

    async def settled(self) -> None:
        await asyncio.gather(*self.background, return_exceptions=True)

    async def fault_redis(self, fault: Fault) -> None:
        away = self.rng.uniform(3.0, 6.0)
        fault.start = now()
        await asyncio.to_thread(self.stack.redis.stop)
        down = now()
        await asyncio.sleep(away)
        await asyncio.to_thread(self.stack.redis.start)
        fault.end = now()
        fault.steps.append(
            f"Redis SHUTDOWN (AOF written) took {down - fault.start:.1f} s, away {away:.1f} s, "
            f"started again on its AOF in {fault.end - down - away:.1f} s"
        )

    async def fault_postgres(self, fault: Fault) -> None:
        away = self.rng.uniform(3.0, 6.0)
        fault.start = now()
        await asyncio.to_thread(self.stack.pg.stop, "fast")
        down = now()
        await asyncio.sleep(away)
        await asyncio.to_thread(self.stack.pg.start)
        fault.end = now()
        fault.steps.append(
            f"pg_ctl stop -m fast took {down - fault.start:.1f} s, away {away:.1f} s, "
            f"pg_ctl start took {fault.end - down - away:.1f} s"
        )

    async def _work_in_hand(self, after: tuple[int, int], timeout: float = 3.0) -> None:
        """Until a withdrawal or collection newer than `after` (the highest ids before the burst) is
        BROADCASTING or PROCESSING (a pool child holds it), or timeout."""
        deadline = now() + timeout
        while now() < deadline:
            busy = await self.load.rows(
                "SELECT (SELECT count(*) FROM wallet_withdrawal WHERE id > %s AND stage = 'BROADCASTING')"
                " + (SELECT count(*) FROM subaccounts_fundcollection WHERE id > %s AND status = 'PROCESSING')",
                list(after),
            )
            if busy[0][0]:
                return
            await asyncio.sleep(0.005)

    async def _kill_with_work_in_flight(self, fault: Fault, kill: Callable[[], str]) -> None:
        """A burst of work, and the kill as soon as a pool child holds some of it."""
        after = (
            await self.load.rows(
                "SELECT (SELECT coalesce(max(id), 0) FROM wallet_withdrawal),"
                " (SELECT coalesce(max(id), 0) FROM subaccounts_fundcollection)"
            )
        )[0]
        burst = asyncio.create_task(self.load.burst())
        await self._work_in_hand(after)
        fault.start = now()
        fault.steps.append(kill())
        fault.in_flight = await self.load.open_work()
        await burst
        self.spawn(self._track_settling(fault))

    async def fault_worker_children(self, fault: Fault) -> None:
        worker = self.stack.supervisor.pid("worker")
        killed: list[int] = []

        def kill() -> str:
            killed.extend(process_children(worker))
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return f"SIGKILL to the worker's {len(killed)} pool children {killed}"

        await self._kill_with_work_in_flight(fault, kill)
        want = self.stack.layout.celery_concurrency
        while len([p for p in process_children(worker) if p not in killed]) < want and now() - fault.start < 60:
            await asyncio.sleep(0.05)
        fault.end = now()
        fault.steps.append(f"the worker had {want} new pool children after {fault.end - fault.start:.1f} s")

    async def fault_worker_whole(self, fault: Fault) -> None:
        old = self.stack.supervisor.pid("worker")

        def kill() -> str:
            pool = process_children(old)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old, signal.SIGKILL)
            return f"SIGKILL to the whole worker (process group of {old}, pool {pool})"

        await self._kill_with_work_in_flight(fault, kill)
        while now() - fault.start < 90:
            pid = self.stack.supervisor.pid("worker")  # 0 while it is not running
            if pid not in (0, old) and len(process_children(pid)) >= self.stack.layout.celery_concurrency:
                break
            await asyncio.sleep(0.1)
        fault.end = now()
        pid = self.stack.supervisor.pid("worker")
        if pid in (0, old):
            fault.problems.append(f"{fault.name}: supervisord did not start the worker again")
        fault.steps.append(
            f"supervisord started the worker again (pid {pid}), ready after {fault.end - fault.start:.1f} s"
        )

    async def _track_settling(self, fault: Fault) -> None:
        ids = {kind: {row[0] for row in rows} for kind, rows in fault.in_flight.items()}
        if not any(ids.values()):
            fault.settled_after = 0.0
            return
        while now() - fault.start < SETTLE_SECONDS + 60:
            with contextlib.suppress(psycopg.Error):
                open_ = await self.load.open_work()
                if not any(row[0] in ids[kind] for kind, rows in open_.items() for row in rows):
                    fault.settled_after = now() - fault.start
                    return
            await asyncio.sleep(0.5)

    def spawn(self, coro) -> None:
        self.background.append(asyncio.create_task(coro))
