"""The lab's faults (`python -m harness.lab fault NAME`), each injected under bank.py's load and
ended with its bank check. Each records its steps and timings on the chaos Fault and may leave a
`heal` (run after the load, before the checks) that brings its host back.

What a fault is given (`run`: bank.LabRun, or simulation/lab.py's LabSimulation): `run.stack` (the
LabStack: its supervisor, port, `on_app_hosts`, `beat_host` and `beat_moved`), `run.heals` (the list
its heals go on), `run.answers` and `run.segments` (what the load saw), and `run.replay_probe()` /
`run.replay(query)` (redis-kill's signed request sent again).

    pg-kill       SIGKILL of Patroni and PostgreSQL on the primary's host (step one's fault)
    pg-cut        the primary's host cut off (its link down; its etcd member goes with it)
    pg-disk       the primary's data directory deleted and its processes killed; the node rebuilt
                  from the others (Patroni re-initialises a member whose data directory is empty)
    redis-kill    SIGKILL of the Redis primary (Sentinel fails over); a transfer signed before it
                  is sent again after it and must be refused
    sentinel-cut  a sentinel's host (a sentinel and a replica) cut off: nothing should change
    rolling       every db and redis host restarted one at a time, the primaries by a planned
                  switchover / failover (rolling.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal

from harness.chaos.records import Fault, now
from harness.lab import cluster, net, topology
from harness.lab.fault import REJOIN_SECONDS, _member, _poll, _redis_host, _replica_of, kill_primary
from harness.lab.rolling import rolling

CUT_SECONDS = 30.0  # how long a cut host stays away (the run watches writes throughout)


async def _new_leader(fault: Fault, old: topology.Host) -> None:
    leader = await _poll(lambda: (h := cluster.pg_leader()) and h != old and h, 90)
    if leader is None:
        fault.problems.append(f"{fault.name}: no new PostgreSQL leader within 90 s")
        return
    fault.steps.append(f"{leader.name} leader (Patroni) +{now() - fault.start:.1f} s")


async def _rejoined(fault: Fault, host: topology.Host, what: str) -> None:
    """Until `host` is a running replica streaming from the leader, and the cluster has its synchronous
    standby again."""

    def streaming() -> bool:
        member = _member(host.name)
        return member.get("role") in ("replica", "sync_standby") and member.get("state") in ("running", "streaming")

    if await _poll(streaming, REJOIN_SECONDS, 1.0):
        fault.steps.append(f"{host.name} {what} +{now() - fault.start:.1f} s ({_member(host.name).get('role')})")
    else:
        fault.problems.append(f"{fault.name}: {host.name} not a running replica within {REJOIN_SECONDS:.0f} s")
    sync = await _poll(cluster.pg_sync_standby, 30, 1.0)
    fault.steps.append(f"synchronous standby {sync}")


async def pg_kill(run, fault: Fault) -> None:
    victim = cluster.pg_leader()
    fault.start = now()
    count = kill_primary(victim)
    fault.steps.append(f"SIGKILL to Patroni and PostgreSQL on {victim.name} ({count} processes)")
    await _new_leader(fault, victim)
    fault.end = now()

    async def heal() -> None:
        await asyncio.to_thread(cluster.rpc().startProcess, f"patroni-{victim.name}", False)
        await _rejoined(fault, victim, "back as a replica (pg_rewind)")

    run.heals.append(heal)


async def pg_cut(run, fault: Fault) -> None:
    victim = cluster.pg_leader()
    fault.start = now()
    net.cut(victim)
    fault.steps.append(f"link of {victim.name} ({victim.address}, the primary, with its etcd member) down")
    await _new_leader(fault, victim)

    async def mend() -> None:
        await asyncio.sleep(max(0.0, CUT_SECONDS - (now() - fault.start)))
        net.mend(victim)
        fault.end = now()
        fault.steps.append(f"link of {victim.name} up again +{fault.end - fault.start:.1f} s")
        await _rejoined(fault, victim, "back as a replica")

    task = asyncio.create_task(mend())
    run.heals.append(lambda: task)


async def pg_disk(run, fault: Fault) -> None:
    victim = cluster.pg_leader()
    data = victim.dir / "data"
    fault.start = now()
    count = kill_primary(victim)
    shutil.rmtree(data)
    fault.steps.append(f"SIGKILL to Patroni and PostgreSQL on {victim.name} ({count} processes), {data} deleted")
    await _new_leader(fault, victim)
    fault.end = now()
    # The machine back with a new, empty disk: Patroni finds no data directory and a cluster with a
    # leader, and builds the member again from it (pg_basebackup), as `patronictl reinit` would.
    await asyncio.to_thread(cluster.rpc().startProcess, f"patroni-{victim.name}", False)
    fault.steps.append(f"Patroni on {victim.name} started on the empty disk +{now() - fault.start:.1f} s")
    task = asyncio.create_task(_rejoined(fault, victim, "rebuilt from the leader, streaming"))
    run.heals.append(lambda: task)


async def redis_kill(run, fault: Fault) -> None:
    victim = _redis_host(cluster.redis_primary())
    query, probe = await run.replay_probe()
    fault.steps.append(f"a transfer signed with recvWindow 60000 sent just before: {probe.label}")
    pid = int(cluster.rpc().getProcessInfo(f"redis-{victim.name}")["pid"])
    fault.start = now()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    fault.steps.append(f"SIGKILL to the Redis primary on {victim.name} (pid {pid})")
    primary = await _poll(lambda: (a := cluster.redis_primary()) and a != victim.address and a, 60)
    fault.end = now()
    if primary is None:
        fault.problems.append(f"{fault.name}: the sentinels did not fail over within 60 s")
    else:
        fault.steps.append(f"the sentinels name {_redis_host(primary).name} primary +{fault.end - fault.start:.1f} s")

    async def heal() -> None:
        # 503 -1001 says nothing was executed and asks the client to try again (the application may
        # still be reaching the new primary, seen once 3.3 s after the failover): sent again, as a
        # client replaying it would, until the service decides; the decision must be a refusal.
        unavailable = 0
        answer = await run.replay(query)
        while (answer.status, answer.code) == (503, -1001) and unavailable < 30:
            unavailable += 1
            await asyncio.sleep(1.0)
            answer = await run.replay(query)
        refused = answer.status is not None and 400 <= answer.status < 500
        retried = f" (after {unavailable} x 503/-1001)" if unavailable else ""
        fault.steps.append(f"the transfer signed before the failover sent again: {answer.label}{retried}")
        if not refused:
            fault.problems.append(f"replay: the replayed signed transfer was not refused ({answer.label})")
        await asyncio.to_thread(cluster.rpc().startProcess, f"redis-{victim.name}", False)
        back = await _poll(lambda: _replica_of(victim), 30, 0.5)
        fault.steps.append(
            f"{victim.name} started again: {'a replica of the new primary' if back else 'NOT a replica'}"
        )

    run.heals.append(heal)


async def sentinel_cut(run, fault: Fault) -> None:
    primary = cluster.redis_primary()
    victim = next(h for h in reversed(topology.REDIS_HOSTS) if h.address != primary)
    fault.start = now()
    net.cut(victim)
    fault.steps.append(f"link of {victim.name} (its sentinel and a replica; the primary is {primary}) down")
    fault.end = now()

    async def mend() -> None:
        await asyncio.sleep(max(0.0, CUT_SECONDS - (now() - fault.start)))
        still = cluster.redis_primary()
        net.mend(victim)
        fault.steps.append(
            f"link up again +{now() - fault.start:.1f} s; the primary throughout: {still}"
            + (" (unchanged)" if still == primary else " (CHANGED)")
        )
        if still != primary:
            fault.problems.append(f"{fault.name}: the Redis primary changed ({primary} -> {still})")
        back = await _poll(lambda: _replica_of(victim), 30, 0.5)
        fault.steps.append(f"{victim.name}'s replica {'in sync again' if back else 'NOT back'}")

    task = asyncio.create_task(mend())
    run.heals.append(lambda: task)


FAULTS = {
    "pg-kill": pg_kill,
    "pg-cut": pg_cut,
    "pg-disk": pg_disk,
    "redis-kill": redis_kill,
    "sentinel-cut": sentinel_cut,
    "rolling": rolling,
}
