"""The lab's first fault run: the stack (nginx, granian, Daphne, Celery worker and beat, as `make run`
starts it) in the machine's own namespace, pointed at the lab (multi-host DATABASE_URL, Redis through
Sentinel); signed transfers from a few clients; SIGKILL of the PostgreSQL primary (Patroni and every
PostgreSQL process on its host; its etcd member lives on); the figures: seconds until writes are
accepted again, what the clients in flight got (-1001/HTTP 503, never a 500), every transfer answered
200 once in the database, `manage.py ledger_check`.

    python -m exchange.stack.lab fault [--before 10] [--after 40] [--clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg

from exchange.api.replay_memory import declare_complete
from exchange.stack import client
from exchange.stack.chaos.records import TRANSFER, send
from exchange.stack.lab import cluster, topology
from exchange.stack.layout import Layout
from exchange.stack.ports import HOST, free_block
from exchange.stack.private import stack_environment
from exchange.stack.run import prepare
from exchange.stack.services import manage
from exchange.stack.supervisor import Supervisor

REDIS_DB = 1


@dataclass
class Sent:
    ident: str
    started: float
    ended: float
    status: int | None
    code: int | None
    ref: str | None


def fresh(env: dict[str, str]) -> None:
    """An empty application database on the primary and an emptied Redis database (via Sentinel)."""
    leader = cluster.pg_leader()
    admin = f"postgres://postgres:{topology.PG_PASSWORD}@{leader.address}:{topology.PG_PORT}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {topology.DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {topology.DATABASE}")
    from redis.sentinel import Sentinel

    hosts = [(h.address, topology.SENTINEL_PORT) for h in topology.REDIS_HOSTS]
    primary = Sentinel(hosts, socket_timeout=2).master_for(topology.MASTER, db=REDIS_DB, socket_timeout=2)
    primary.flushdb()
    declare_complete(primary)


def postgres_pids(host: topology.Host) -> list[int]:
    """Patroni and every PostgreSQL process in `host`'s namespace (not its etcd member)."""
    listed = subprocess.run(  # noqa: S603 - our own arguments
        ["ip", "netns", "pids", host.netns],  # noqa: S607 - iproute2 from PATH, as net.py
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    pids = []
    for pid in map(int, listed):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "etcd" not in cmdline:
            pids.append(pid)
    return pids


def kill_primary(host: topology.Host) -> int:
    pids = postgres_pids(host)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


async def transfer_client(port, signers, world, counter, sent, stop, index) -> None:
    role, other = ("master", "peer") if index % 2 == 0 else ("peer", "master")
    signer = signers[role]
    conn = client.HttpConnection(HOST, port)
    try:
        while not stop.is_set():
            n = next(counter)
            ident = f"lab-t{n}"
            params = {"account": "USDT", "target_address": world[other]["email"], "amount": "0.01"}
            params["client_transfer_id"] = ident
            started = time.monotonic()
            status, body, _hung = await send(conn, "POST", f"{TRANSFER}?{signer.signed(params)}", signer.api_key)
            code = ref = None
            try:
                data = json.loads(body) if body else {}
            except ValueError:
                data = {}
            if isinstance(data, dict):
                code = data.get("code") if status != 200 else None
                ref = str(data.get("transfer", {}).get("id")) if status == 200 else None
            sent.append(Sent(ident, started, time.monotonic(), status, code, ref))
            await asyncio.sleep(0.05 if status != 200 else 0.01)
    finally:
        await conn.close()


async def drive(port, signers, world, clients: int, before: float, after: float, say) -> tuple[list[Sent], float, str]:
    sent: list[Sent] = []
    stop = asyncio.Event()
    counter = itertools.count()
    tasks = [asyncio.create_task(transfer_client(port, signers, world, counter, sent, stop, i)) for i in range(clients)]
    await asyncio.sleep(before)
    victim = cluster.pg_leader()
    killed_at = time.monotonic()
    count = kill_primary(victim)
    say(f"SIGKILL to Patroni and PostgreSQL on {victim.name} ({victim.address}, the primary): {count} processes")
    await asyncio.sleep(after)
    stop.set()
    await asyncio.gather(*tasks)
    return sent, killed_at, victim.name


def report(sent: list[Sent], killed_at: float, book_rows: dict[str, list[str]]) -> tuple[bool, list[str]]:
    lines = []
    after = [s for s in sent if s.started >= killed_at]
    first_fail = next((s for s in sorted(after, key=lambda s: s.ended) if s.status != 200), None)
    back = next((s for s in sorted(after, key=lambda s: s.started) if s.status == 200 and first_fail), None)
    statuses = Counter(s.status for s in sent)
    codes = Counter(s.code for s in sent if s.status != 200)
    lines.append(f"{len(sent)} transfers sent: statuses {dict(statuses)}, error codes {dict(codes)}")
    if first_fail is not None and back is not None:
        lines.append(
            f"writes refused from +{first_fail.ended - killed_at:.1f} s; accepted again at "
            f"+{back.started - killed_at:.1f} s after the SIGKILL (first request started after it answered 200)"
        )
    elif first_fail is None:
        lines.append("no request after the kill was refused")
    else:
        lines.append("writes NOT accepted again within the run")
    bad = []
    for s in sent:
        found = book_rows.get(s.ident, [])
        if s.status == 200 and found != [s.ref]:
            bad.append(f"{s.ident}: 200 (id {s.ref}) but the database has {found}")
        if len(found) > 1:
            bad.append(f"{s.ident}: {len(found)} rows")
    refused_done = [s.ident for s in sent if s.status not in (200, None) and book_rows.get(s.ident)]
    unknown = [s for s in sent if s.status is None]
    lines.append(
        f"every 200 once in the database with its id: {'yes' if not bad else 'NO'}; refused yet done "
        f"(the commit's answer lost with the primary; the client finds it by client_transfer_id): {len(refused_done)}; "
        f"no answer: {len(unknown)}"
    )
    lines += bad[:10]
    ok = not bad and statuses.get(500, 0) == 0 and back is not None
    return ok, lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m exchange.stack.lab fault")
    parser.add_argument("--before", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    t0 = time.monotonic()

    def say(text: str) -> None:
        sys.stdout.write(f"[lab +{time.monotonic() - t0:6.1f}s] {text}\n")
        sys.stdout.flush()

    if cluster.pg_leader() is None:
        raise SystemExit("the lab is not up: python -m exchange.stack.lab up")
    port = free_block()
    run_dir = topology.LAB_DIR / "stack"
    app = topology.app_env(REDIS_DB)
    env = stack_environment(app["DATABASE_URL"], app["REDIS_URL"], port, run_dir) | app
    fresh(env)
    manage(env, "migrate", "--noinput", "-v", "0")
    world = json.loads(manage(env, "demo", "--json").stdout.strip().splitlines()[-1])
    signers = {r: client.Signer(world[r]["api_key"], world[r]["secret_key"]) for r in ("master", "peer")}
    layout = Layout.from_env(env, port=port, run_dir=run_dir)
    stack = Supervisor(prepare(env, layout), env, run_dir, log=run_dir / "stack.log")
    stack.start()
    primaries = f"PostgreSQL primary {cluster.pg_leader().name}, Redis primary {cluster.redis_primary()}"
    say(f"stack up on {HOST}:{port}; {primaries}")
    try:
        sent, killed_at, victim = asyncio.run(drive(port, signers, world, args.clients, args.before, args.after, say))
        say(f"after: {json.dumps(cluster.status())}")
        with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
            rows = conn.execute(
                "SELECT client_transfer_id, id FROM wallet_transfer WHERE client_transfer_id LIKE %s", ["lab-t%"]
            ).fetchall()
        book: dict[str, list[str]] = {}
        for ident, pk in rows:
            book.setdefault(ident, []).append(str(pk))
        ok, lines = report(sent, killed_at, book)
        for line in lines:
            say(line)
        done = manage(env, "ledger_check", check=False)
        say(f"ledger_check: exit {done.returncode}: {(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        ok = ok and done.returncode == 0
    finally:
        stack.stop()
        cluster.rpc().startProcess(f"patroni-{victim}", False)  # the old primary rejoins as a replica
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
