"""The lab's fault runs: `python -m exchange.stack.lab fault [NAME] [--before S] [--after S]`, NAME one of
faults.py's (default pg-kill, step one's SIGKILL of the PostgreSQL primary), each under bank.py's load
and ended with its bank check; and the helpers the faults share (an empty application database,
the primary's processes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

from exchange.api.replay_memory import declare_complete
from exchange.stack.lab import topology

REDIS_DB = 1


def fresh(env: dict[str, str]) -> None:
    """An empty application database on the primary and an emptied Redis database (via Sentinel)."""
    from exchange.stack.lab import cluster

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


def main(argv: list[str]) -> int:
    from exchange.stack.lab.bank import run_fault
    from exchange.stack.lab.faults import FAULTS

    parser = argparse.ArgumentParser(prog="python -m exchange.stack.lab fault")
    parser.add_argument("name", nargs="?", default="pg-kill", choices=sorted(FAULTS))
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the fault")
    parser.add_argument("--after", type=float, default=40.0, help="seconds of load after it")
    args = parser.parse_args(argv)
    return 0 if run_fault(args.name, FAULTS[args.name], before=args.before, after=args.after, out=sys.stdout) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
