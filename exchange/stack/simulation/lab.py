"""`manage.py simulate --lab`: the simulation on the HA lab (docs/scaling.md) instead of a private
PostgreSQL and Redis. The stack, as `make run` starts it, points at the lab (`python -m
exchange.stack.lab env`: the libpq multi-host DATABASE_URL, Redis through Sentinel); its faults are
drawn with the seed from the lab's catalogue (pg-kill, pg-cut, redis-kill, sentinel-cut, rolling:
exchange/stack/lab/faults.py) and the simulation's own that still apply (the Celery worker killed,
whole or its pool children; a restart of its private PostgreSQL or Redis has no meaning here). A lab
fault runs to its end, its host brought back, before the next starts. The end checks are the same.
"""

from __future__ import annotations

import random

from exchange.stack.chaos.records import Answer, Fault, now
from exchange.stack.lab import cluster
from exchange.stack.lab.fault import OnTheLab
from exchange.stack.simulation.driver import Simulation
from exchange.stack.simulation.plan import FIRST_FAULT_SECONDS, QUIET_END_SECONDS

LAB_FAULTS = ("pg-kill", "pg-cut", "redis-kill", "sentinel-cut", "rolling")
OWN_FAULTS = ("worker_kill", "worker_children_kill")
GAP_SECONDS = (10.0, 25.0)  # after the previous fault's end: a lab fault lasts 15 s to a few minutes


def lab_fault_plan(seed: int, minutes: float) -> list[tuple[float, str]]:
    """Every kind once in the seed's order, then the seed's choices; the times are the earliest each
    may start (faults_timeline runs one after the other)."""
    rng = random.Random(f"lab-{seed}")  # noqa: S311 - a reproducible schedule, not a secret
    kinds = [*LAB_FAULTS, *OWN_FAULTS]
    order = rng.sample(kinds, len(kinds))
    plan, t = [], FIRST_FAULT_SECONDS
    while t < minutes * 60.0 - QUIET_END_SECONDS:
        plan.append((round(t, 3), order[len(plan)] if len(plan) < len(order) else rng.choice(kinds)))
        t += rng.uniform(*GAP_SECONDS)
    return plan


def lab_is_up() -> bool:
    return cluster.pg_leader() is not None and cluster.redis_primary() is not None


class LabSimulation(OnTheLab, Simulation):
    def __init__(self, seed: int, minutes: float, customers: int, out) -> None:
        super().__init__(seed, minutes, customers, out)
        self.fault_plan = lab_fault_plan(seed, minutes)
        self.heals: list = []

    def describe(self) -> str:
        return (
            f"stack on the lab, port {self.port}: PostgreSQL primary {cluster.pg_leader().name} (Patroni), "
            f"Redis primary {cluster.redis_primary()} (Sentinel); faults {[n for _, n in self.fault_plan]}"
        )

    async def fault(self, name: str) -> dict:
        if name not in LAB_FAULTS:
            return await super().fault(name)
        from exchange.stack.lab.faults import FAULTS

        fault, self.heals = Fault(name), []
        began = now()
        await FAULTS[name](self, fault)
        for heal in self.heals:  # its host back before anything else happens
            await heal()
        self.violations.extend(f"lab fault {name}: {p}" for p in fault.problems)
        return {"name": name, "start": fault.start or began, "end": now(), "steps": fault.steps}

    # redis-kill's probe: a signed get-quote (it moves no money) with recvWindow 60000, sent again later

    async def replay_probe(self) -> tuple[str, Answer]:
        params = {"sourceCurrency": "USDT", "targetCurrency": "PHP", "sourceAmount": "5", "recvWindow": "60000"}
        answer, _ = await self.call("witness", "quote", params, kind="probe")
        return answer.query, Answer("probe", "replay-probe", "witness", answer.started, answer.ended, answer.status)

    async def replay(self, query: str) -> Answer:
        answer, _ = await self.call("witness", "quote", {}, kind="replay", query=query)
        return answer
