"""What the lab's fault runs share (`python -m harness.lab fault [NAME]`, faults.py under
bank.py's load and bank check): the lab's stack (LabStack) on an empty application database, the
primary's processes and their kill; polling Patroni's members and Redis's replicas (faults.py and
rolling.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

from exchange.api.replay_memory import declare_complete
from harness.chaos.records import now
from harness.lab import apphosts, cluster, net, topology
from harness.ports import HOST, free_block
from harness.private import Book, Stack, stack_environment
from harness.services import manage

REDIS_DB = 1
REJOIN_SECONDS = 180.0


def redis_client(db: int = REDIS_DB):
    """The lab's Redis primary (database `db`) through Sentinel, with the lab's passwords."""
    return topology.redis_primary(db)


def fresh(db: int = REDIS_DB) -> None:
    """An empty application database on the primary and an emptied Redis database `db` (via Sentinel)."""
    cluster.recreate_database()
    primary = redis_client(db)
    primary.flushdb()
    declare_complete(primary)


class LabStack(Stack):
    """The stack of a run (the chaos run's load, the simulation) on the lab's PostgreSQL and Redis,
    through Patroni's multi-host URL and Sentinel, instead of private servers: a fresh application
    database and Redis database each time; `stop` leaves the lab up. Its files in `stack_dir` (None:
    `base`/stack). With `on_app_hosts` the stack runs on app1 and app2 behind HAProxy (apphosts.py)
    instead of in this namespace; `beat_host` is then the app host whose beat holds RedBeat's lock
    (a fault that kills it names the other with `beat_moved`)."""

    def __init__(self, base: Path, *, on_app_hosts: bool = False, stack_dir: Path | None = None) -> None:
        self.base = base
        self.on_app_hosts = on_app_hosts
        self.stack_dir = stack_dir
        self.beat_host: topology.Host | None = None

    def start(self, database: str, *demo_args: str, **env: str) -> dict:
        app = topology.app_env(REDIS_DB)
        fresh()
        if self.on_app_hosts:
            return self.launch_on_app_hosts(*demo_args, **(app | env))
        run_dir = self.stack_dir or self.base / "stack"
        return self.launch(run_dir, app["DATABASE_URL"], app["REDIS_URL"], *demo_args, **(app | env))

    def launch_on_app_hosts(self, *demo_args: str, **env: str) -> dict:
        """As Stack.launch, the programs on app1 and app2 (apphosts.py) and HAProxy on the port the
        clients use; app1's beat holds RedBeat's lock (`beat_host`)."""
        self.port = free_block(1)
        self.run_dir = apphosts.RUN_DIR
        base = stack_environment(env["DATABASE_URL"], env["REDIS_URL"], self.port, self.run_dir)
        self.env = apphosts.app_env(base | env)
        for args in (("migrate", "--noinput", "-v", "0"), ("demo", *demo_args)):
            done = manage(self.env, *args)
        self.book = Book(self.env["DATABASE_URL"])
        self.layout = apphosts.host_layout(topology.APP_HOSTS[0], self.env)
        self.supervisor = apphosts.supervisor(self.env, self.port)
        self.supervisor.start()
        apphosts.wait_ready(topology.APP_HOSTS, self.port)
        apphosts.start_beats(self.supervisor, redis_client())
        self.beat_host = topology.APP_HOSTS[0]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def beat_moved(self, host: topology.Host) -> None:
        self.beat_host = host

    def describe(self) -> str:
        if self.on_app_hosts:
            return (
                f"stack up on app1 and app2 behind HAProxy ({HOST}:{self.port}); beat-{self.beat_host.name} holds "
                f"RedBeat's lock; PostgreSQL primary {cluster.pg_leader().name}, "
                f"Redis primary {cluster.redis_primary()}"
            )
        return (
            f"stack up on {HOST}:{self.port} (nginx): granian {self.layout.rest_workers} x {self.layout.rest_threads}, "
            f"Daphne x {len(self.layout.ws_ports)}, Celery worker ({self.layout.celery_concurrency}) and beat; "
            f"PostgreSQL primary {cluster.pg_leader().name}, Redis primary {cluster.redis_primary()} (the lab)"
        )

    def stop(self) -> None:
        self.stop_programs()


def postgres_pids(host: topology.Host) -> list[int]:
    """Patroni and every PostgreSQL process in `host`'s namespace (not its etcd member)."""
    found = []
    for pid in net.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "etcd" not in cmdline:
            found.append(pid)
    return found


def kill_primary(host: topology.Host) -> int:
    pids = postgres_pids(host)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


async def _poll(predicate, timeout: float, every: float = 0.2):
    """The first true value of `predicate()` (run in a thread) within `timeout`, else None."""
    deadline = now() + timeout
    while now() < deadline:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        await asyncio.sleep(every)
    return None


def _member(name: str) -> dict:
    return next((m for m in cluster.pg_cluster().get("members", []) if m.get("name") == name), {})


def _redis_host(address: str) -> topology.Host:
    return next(h for h in topology.REDIS_HOSTS if h.address == address)


def _replica_of(host: topology.Host) -> bool:
    import redis

    try:
        info = topology.redis_at(host, socket_timeout=1).info("replication")
    except redis.RedisError:
        return False
    return info.get("role") == "slave" and info.get("master_link_status") == "up"
