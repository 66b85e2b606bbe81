"""`python -m harness.simulation --lab`: the simulation on the HA lab (docs/scaling.md) instead of a private
PostgreSQL and Redis. The stack's programs run on the application hosts app1 and app2 behind HAProxy
(harness/lab/apphosts.py, as `hostfault`), pointed at the lab (`python -m harness.lab
env`: the libpq multi-host DATABASE_URL, Redis through Sentinel; RedBeat's lock on app1's beat first);
its faults are drawn with the seed from the lab's catalogue (pg-kill, pg-cut, redis-kill, sentinel-cut,
rolling: harness/lab/faults.py; app-kill: the app host holding RedBeat's lock killed with its
websockets and requests, brought back after) and the simulation's own that still apply (the Celery
worker of an app host killed, whole or its pool children; the connections in a transaction dropped; a
restart of its private PostgreSQL or Redis has no meaning here). A lab fault runs to its end, its host
brought back, before the next starts. The end checks are the same.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from harness.chaos.records import Answer, Check, Fault, now, tally
from harness.lab import apphosts, cluster, topology
from harness.lab.fault import LabStack, redis_client
from harness.lab.hostfault import Heights
from harness.simulation.driver import Simulation
from harness.simulation.faults import Faults
from harness.simulation.plan import FIRST_FAULT_SECONDS, QUIET_END_SECONDS
from harness.simulation.world import Customers, SimRecord

LAB_FAULTS = ("pg-kill", "pg-cut", "redis-kill", "sentinel-cut", "rolling", "app-kill")
OWN_FAULTS = ("worker_kill", "worker_children_kill", "connections_dropped")
APP_AWAY_SECONDS = (10.0, 20.0)  # how long a killed app host stays down (seeded)
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


def _cut_by_a_kill(answer: Answer, kills: list[tuple[float, float]]) -> bool:
    """HAProxy's 502 for a request sent before the kill was over and answered after it began."""
    return (
        answer.status == 502
        and answer.code is None
        and any(answer.started <= done and answer.ended >= began for began, done in kills)
    )


def judge_answers(answers: list[Answer], kills: list[tuple[float, float]], t0: float) -> Check:
    """The simulation's rule (no 5xx but 503 -1001), less HAProxy's own 502 (an HTML page: no code)
    for a request that was on an app host when app-kill killed it (`kills`: each kill's start and its
    last SIGKILL; the request sent before the kill was over, answered after it began): the host died
    holding it, the balancer can only say so. Its outcome is unknown to the client, as a request
    without an answer, and resolved at the end like one (Settle)."""
    cut = [a for a in answers if _cut_by_a_kill(a, kills)]
    breaking = [a for a in answers if a.breaks_a_rule and not any(a is c for c in cut)]
    moments = ", ".join(f"+{b - t0:.2f} s" for b, _ in kills)
    detail = f"{len(answers)} requests {tally(answers)}; in flight on an app host killed ({moments}): {tally(cut)}"
    if breaking:
        named = ", ".join(f"{a.kind} {a.ident} (+{a.started - t0:.2f} s)" for a in breaking[:10])
        detail += f"; BREAKING THE RULES {tally(breaking)}: {named}"
    return Check("answers", not breaking, detail)


class LabFaults(Faults):
    """The simulation's faults on the lab: the lab's catalogue (harness/lab/faults.py, given this
    object as their run: its `stack`, `heals`, `answers`, `segments`, `replay_probe` and `replay`),
    app-kill, and the simulation's own that apply (the worker faults hit an app host's worker)."""

    def __init__(self, stack: LabStack, accounts: Customers, record: SimRecord, fault_plan: list) -> None:
        super().__init__(stack, accounts, record, fault_plan)
        self.heals: list = []
        self.app_kills: list[tuple[float, float]] = []  # app-kill's kills: (began, every SIGKILL sent)
        self.answers, self.segments = record.answers, record.segments  # what a lab fault reads

    async def fault(self, name: str) -> dict:
        if name not in LAB_FAULTS:
            return await super().fault(name)
        from harness.lab.faults import FAULTS

        fault, self.heals = Fault(name), []
        began = now()
        await (self.app_kill(fault) if name == "app-kill" else FAULTS[name](self, fault))
        for heal in self.heals:  # its host back before anything else happens
            await heal()
        self.record.violations.extend(f"lab fault {name}: {p}" for p in fault.problems)
        return {"name": name, "start": fault.start or began, "end": now(), "steps": fault.steps}

    # redis-kill's probe: a signed get-quote (it moves no money) with recvWindow 60000, sent again later

    async def replay_probe(self) -> tuple[str, Answer]:
        params = {"sourceCurrency": "USDT", "targetCurrency": "PHP", "sourceAmount": "5", "recvWindow": "60000"}
        answer, _ = await self.accounts.call("witness", "quote", params, kind="probe")
        return answer.query, Answer("probe", "replay-probe", "witness", answer.started, answer.ended, answer.status)

    async def replay(self, query: str) -> Answer:
        answer, _ = await self.accounts.call("witness", "quote", {}, kind="replay", query=query)
        return answer

    # --- the application hosts' faults ---------------------------------------------------------------

    async def app_kill(self, fault: Fault) -> None:
        """SIGKILL to every process of the app host holding RedBeat's lock (its websockets, its requests
        in flight, its worker's task); the other host's beat takes the lock over; the host brought back
        (its programs started, healthy on HAProxy) after a seeded time away."""
        stack = self.stack
        victim = stack.beat_host
        other = next(h for h in topology.APP_HOSTS if h != victim)
        draw = self.record.seed + len(self.record.faults)
        away = random.Random(draw).uniform(*APP_AWAY_SECONDS)  # noqa: S311 - not a secret
        heights = Heights(redis_client())
        heights.thread.start()
        await asyncio.sleep(1.5)  # a run or two of the beat before the kill
        fault.start = now()
        killed_at = now()  # time.monotonic(), as Heights' clock
        count = await asyncio.to_thread(apphosts.kill_host, stack.supervisor, victim)
        self.app_kills.append((killed_at, now()))  # from before the pids are listed until the last SIGKILL
        stack.beat_moved(other)
        fault.steps.append(f"SIGKILL to every process on {victim.name} (RedBeat's holder): {count}")
        await asyncio.sleep(away)
        heights.stop.set()
        after = [t for t, _ in heights.changes[1:] if t >= killed_at]
        doubled = heights.doubled()
        fault.steps.append(
            f"beat-{other.name} ran the 1 s entry "
            + (f"+{after[0] - killed_at:.1f} s after the kill" if after else "NOT within the time away")
            + f", periods run twice: {doubled}"
        )
        if not after or doubled:
            fault.problems.append(
                f"app-kill: the beat did not move to {other.name} once ({len(after)} runs, {doubled})"
            )
        began = now()
        await asyncio.to_thread(apphosts.start_programs, stack.supervisor, victim, stack.port)
        up = await asyncio.to_thread(apphosts.wait_up, victim)
        fault.steps.append(
            f"{victim.name} down {away:.1f} s, its programs started again, "
            + (f"up on HAProxy +{now() - began:.1f} s" if up else "NOT up on HAProxy within 30 s")
        )
        if not up:
            fault.problems.append(f"app-kill: {victim.name} not up on HAProxy after its restart")

    def worker_program(self) -> str:
        """The worker faults hit one app host's worker, drawn with the seed (its supervisord starts it
        again, as make run's)."""
        draw = self.record.seed + len(self.record.faults)
        host = random.Random(draw).choice(topology.APP_HOSTS)  # noqa: S311 - not a secret
        return f"worker-{host.name}"


class LabSimulation(Simulation):
    """The simulation with the lab's stack (on the app hosts), the lab's fault plan and LabFaults; its
    answers judged less HAProxy's 502 for a request on a killed app host (judge_answers)."""

    on_app_hosts = True

    def __init__(self, seed: int, minutes: float, customers: int, out) -> None:
        super().__init__(seed, minutes, customers, out)
        self.fault_plan = lab_fault_plan(seed, minutes)

    def new_stack(self, base: Path) -> LabStack:
        return LabStack(base, on_app_hosts=self.on_app_hosts)

    def new_faults(self) -> LabFaults:
        return LabFaults(self.stack, self.accounts, self.record, self.fault_plan)

    @property
    def stack_log(self) -> Path:
        return self.stack.run_dir / "lab.log"  # the app hosts' supervisord's (apphosts.py)

    def describe(self) -> str:
        return (
            f"stack on app1 and app2 behind HAProxy, port {self.stack.port}, beat-{self.stack.beat_host.name} holding "
            f"RedBeat's lock: PostgreSQL primary {cluster.pg_leader().name} (Patroni), "
            f"Redis primary {cluster.redis_primary()} (Sentinel); faults {[n for _, n in self.fault_plan]}"
        )

    def check_answers(self) -> Check:
        """The simulation's rule less HAProxy's 502 for a request on a killed app host (judge_answers)."""
        check = super().check_answers()
        return check if check.ok else judge_answers(self.record.answers, self.faults.app_kills, self.record.t0)
