"""The lab's rolling restart (`python -m harness.lab fault rolling`): every host of the lab
restarted one at a time under bank.py's load, as an operator upgrading them would.

    db hosts     the replicas first (the asynchronous one, then the synchronous standby): Patroni
                 stopped (it stops its PostgreSQL cleanly) and the host's etcd member, both started
                 again; the next host once this one streams again. The leader last: a planned
                 switchover to the synchronous standby (Patroni's REST API, what `patronictl
                 switchover` calls), then its host restarted as a replica.
    redis hosts  the replicas first (Redis and the sentinel stopped and started; the next once it is
                 a replica in sync), then `SENTINEL FAILOVER` and the former primary's host restarted.

    app hosts    the fault's stack runs on app1 and app2 behind HAProxy (bank.py, `on_app_hosts`); each
                 in turn drained on HAProxy's runtime API (`set server ... state drain`: no new
                 request; the REST requests in flight end), put in `maint`, its programs stopped
                 gracefully (Daphne's websockets end with it, 1006 to the clients through HAProxy:
                 they connect again through HAProxy to the other host and resync; the beat gives
                 RedBeat's lock up), started again, healthy, `ready`; the next once HAProxy's checks
                 see it up.

Each step's refusals (transfers not answered 200 that started during the step) and the websockets
closed during it are counted once the load is over; the beat's runs (RedBeat's count of the 1 s
entry, hostfault.Heights) tell whether it moved and whether a period ran twice.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.request

from harness.chaos.records import Fault, now, tally
from harness.lab import apphosts, cluster, topology
from harness.lab.fault import REJOIN_SECONDS, _member, _poll, _redis_host, _replica_of, redis_client
from harness.lab.hostfault import Heights

Span = tuple[str, float, float]  # (what, started, ended)


async def _restart(programs: list[str]) -> None:
    rpc = cluster.rpc()
    for name in programs:  # stopped in order (Patroni before its etcd member), started in reverse
        await asyncio.to_thread(rpc.stopProcess, name, True)
    for name in reversed(programs):
        await asyncio.to_thread(rpc.startProcess, name, False)


def _streaming(host: topology.Host) -> bool:
    member = _member(host.name)
    return member.get("role") in ("replica", "sync_standby") and member.get("state") in ("running", "streaming")


async def _db_host(fault: Fault, spans: list[Span], host: topology.Host, what: str) -> None:
    began = now()
    await _restart([f"patroni-{host.name}", f"etcd-{host.name}"])
    stopped = now() - began
    back = await _poll(lambda: _streaming(host), REJOIN_SECONDS, 0.5)
    sync = await _poll(cluster.pg_sync_standby, 30, 0.5)
    ended = now()
    spans.append((f"{host.name} ({what}) restarted", began, ended))
    fault.steps.append(
        f"{host.name} ({what}): stopped and started in {stopped:.1f} s, "
        + (f"streaming again +{ended - began:.1f} s" if back else "NOT streaming again")
        + f", synchronous standby {sync}"
    )
    if not back:
        fault.problems.append(f"rolling: {host.name} not a running replica within {REJOIN_SECONDS:.0f} s")


def _switchover(leader: topology.Host, candidate: str) -> tuple[int, str]:
    body = json.dumps({"leader": leader.name, "candidate": candidate}).encode()
    url = f"http://{leader.address}:{topology.PATRONI_PORT}/switchover"
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - the lab's own host
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


async def _postgres(fault: Fault, spans: list[Span]) -> None:
    leader = cluster.pg_leader()
    sync = cluster.pg_sync_standby()
    replicas = [h for h in topology.DB_HOSTS if h != leader]
    replicas.sort(key=lambda h: h.name == sync)  # the asynchronous replica first
    for host in replicas:
        role = "synchronous standby" if host.name == sync else "replica"
        await _db_host(fault, spans, host, role)
    candidate = cluster.pg_sync_standby()
    began = now()
    status, text = await asyncio.to_thread(_switchover, leader, candidate)
    new = await _poll(lambda: (h := cluster.pg_leader()) and h != leader and h, 60)
    ended = now()
    spans.append((f"switchover {leader.name} -> {candidate}", began, ended))
    fault.steps.append(
        f"switchover {leader.name} -> {candidate}: HTTP {status} {text.strip()[:60]!r}, "
        + (f"{new.name} leader +{ended - began:.1f} s" if new else "NO new leader")
    )
    if new is None:
        fault.problems.append(f"rolling: no new leader after the switchover ({status} {text[:80]})")
        return
    await _db_host(fault, spans, leader, "the former leader")


async def _redis_restart(fault: Fault, spans: list[Span], host: topology.Host, what: str) -> None:
    began = now()
    await _restart([f"sentinel-{host.name}", f"redis-{host.name}"])
    back = await _poll(lambda: _replica_of(host), 60, 0.5)
    ended = now()
    spans.append((f"{host.name} ({what}) restarted", began, ended))
    fault.steps.append(
        f"{host.name} ({what}): " + (f"a replica in sync again +{ended - began:.1f} s" if back else "NOT in sync")
    )
    if not back:
        fault.problems.append(f"rolling: {host.name} not a replica in sync within 60 s")


async def _redis(fault: Fault, spans: list[Span]) -> None:

    primary = _redis_host(cluster.redis_primary())
    for host in [h for h in topology.REDIS_HOSTS if h != primary]:
        await _redis_restart(fault, spans, host, "replica")
    began = now()
    sentinel = topology.sentinel_at(topology.REDIS_HOSTS[0], socket_timeout=2)
    await asyncio.to_thread(sentinel.execute_command, "SENTINEL", "FAILOVER", topology.MASTER)
    new = await _poll(lambda: (a := cluster.redis_primary()) and a != primary.address and a, 60)
    ended = now()
    spans.append((f"SENTINEL FAILOVER from {primary.name}", began, ended))
    if new is None:
        fault.problems.append("rolling: SENTINEL FAILOVER named no new primary within 60 s")
        return
    fault.steps.append(f"SENTINEL FAILOVER: {_redis_host(new).name} primary +{ended - began:.1f} s")
    # Sentinel demotes the old primary only at its next look (~10 s): its clients' open connections
    # keep writing to it meanwhile, writes the demotion then drops (run 2: 70 x -1021 when they moved).
    # Demoted now, as Sentinel would, its clients get READONLY and redis-py asks the sentinels again.
    old = topology.redis_at(primary, socket_timeout=2)
    await asyncio.to_thread(old.execute_command, "REPLICAOF", new, str(topology.REDIS_PORT))
    # The sentinel that ran the failover names the new primary at once, the others ~3 s later, and
    # the old primary is demoted (its redis.conf rewritten) later still: restarted before that, it
    # came back as an empty primary that two sentinels still named (the first run: 84 x -1021, the
    # replay memory's epoch restart, 4 x 503).
    settled = await _poll(lambda: _sentinels_agree(new) and _role(primary) == "slave", 60, 0.5)
    fault.steps.append(
        f"every sentinel names {_redis_host(new).name}, {primary.name} demoted: "
        + (f"+{now() - began:.1f} s" if settled else "NOT within 60 s")
    )
    await _redis_restart(fault, spans, primary, "the former primary")


def _sentinels_agree(address: str) -> bool:
    import redis

    for host in topology.REDIS_HOSTS:
        try:
            named = topology.sentinel_at(host, socket_timeout=1).execute_command(
                "SENTINEL", "get-master-addr-by-name", topology.MASTER
            )
        except redis.RedisError:
            return False
        if not named or named[0].decode() != address:
            return False
    return True


def _role(host: topology.Host) -> str | None:
    import redis

    try:
        return topology.redis_at(host, socket_timeout=1).info("replication")["role"]
    except redis.RedisError:
        return None


async def _apps(run, fault: Fault, spans: list[Span]) -> None:
    heights = Heights(redis_client())
    heights.thread.start()
    steps: list[tuple[topology.Host, float, float, float]] = []  # (host, began, its beat stopped, ended)
    try:
        for host in topology.APP_HOSTS:
            began = now()
            drained = await asyncio.to_thread(apphosts.drain, host)
            await asyncio.to_thread(apphosts.set_state, host, "maint")
            await asyncio.to_thread(apphosts.stop_programs, run.stack.supervisor, host)
            stopped = now()
            await asyncio.to_thread(apphosts.start_programs, run.stack.supervisor, host, run.stack.port)
            await asyncio.to_thread(apphosts.set_state, host, "ready")
            up = await asyncio.to_thread(apphosts.wait_up, host)
            ended = now()
            if host == run.stack.beat_host:
                run.stack.beat_moved(next(h for h in topology.APP_HOSTS if h != host))
            spans.append((f"{host.name} (app host) restarted", began, ended))
            steps.append((host, began, stopped, ended))
            fault.steps.append(
                f"{host.name}: drained in {drained:.1f} s, programs stopped +{stopped - began:.1f} s, "
                + (f"healthy and enabled again +{ended - began:.1f} s" if up else "NOT up on HAProxy within 30 s")
            )
            if not up:
                fault.problems.append(f"rolling: {host.name} not up on HAProxy within 30 s of its restart")
        await asyncio.sleep(3)  # the beat's runs after the last step
    finally:
        heights.stop.set()

    async def report() -> None:
        fault.steps.extend(_app_figures(run, heights, steps))
        doubled = heights.doubled()
        if doubled:
            fault.problems.append(f"rolling: the beat ran {doubled} period(s) twice")

    run.heals.append(report)


def _app_figures(run, heights: Heights, steps) -> list[str]:
    changes, lines = heights.changes[1:], []  # the first reading is not a run
    for host, began, stopped, ended in steps:
        closed = [s for s in run.segments if s.closed is not None and began <= s.closed <= ended]
        runs = [t for t, _ in changes if began <= t <= ended]
        gap = max((b - a for a, b in itertools.pairwise([began, *runs, ended])), default=0.0)
        after = next((t for t in runs if t >= stopped), None)
        lines.append(
            f"{host.name}: {len(closed)} websocket(s) closed by its Daphne and connected again "
            f"({sorted({s.closed_with for s in closed})}); the beat ran {len(runs)} time(s) during the step, "
            f"longest pause {gap:.1f} s, first run after its programs stopped "
            + (f"+{after - stopped:.1f} s" if after is not None else "none")
        )
    lines.append(
        f"beat: {len(changes)} runs of the 1 s entry over the app hosts' restarts, shortest interval "
        f"{min(heights.intervals(), default=0.0):.2f} s, periods run twice: {heights.doubled()}"
    )
    return lines


def refusals(run, spans: list[Span]) -> list[str]:
    """Per step: the transfers started during it, those not answered 200, and the span they cover."""
    lines = []
    for what, began, ended in spans:
        writes = [a for a in run.answers if a.kind == "transfer" and began <= a.started <= ended]
        failed = [a for a in writes if a.status != 200]
        slow = max((a.ended - a.started for a in writes), default=0.0)
        span = (
            f"refused from +{min(a.started for a in failed) - began:.1f} s to "
            f"+{max(a.ended for a in failed) - began:.1f} s"
            if failed
            else "none refused"
        )
        lines.append(
            f"{what} ({ended - began:.1f} s): {len(writes)} transfers {tally(writes)}, {span}; slowest {slow:.1f} s"
        )
    return lines


async def rolling(run, fault: Fault) -> None:
    spans: list[Span] = []
    fault.start = now()
    await _postgres(fault, spans)
    await _redis(fault, spans)
    apps = run.stack.on_app_hosts
    if apps:
        await _apps(run, fault, spans)
    fault.end = now()
    hosts = "db, redis and app" if apps else "db and redis"
    fault.steps.append(f"every {hosts} host restarted once in {fault.end - fault.start:.1f} s")

    async def report() -> None:  # the load is over: every answer is in
        fault.steps.extend(refusals(run, spans))

    run.heals.append(report)
