"""The shared PostgreSQL and Redis (`make services`, scripts/services.sh) as the harness's users need
them: their URLs, a private database and Redis database that are emptied and dropped again,
`manage.py` with this interpreter, the demo world, and programs in process groups that are always
stopped (the benches' and the fault tests' own servers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from exchange.api.replay_memory import declare_complete
from harness.layout import ROOT

PYTHON = sys.executable


def services_env() -> dict[str, str]:
    """DATABASE_URL and REDIS_URL of the shared servers (scripts/services.sh starts them if needed)."""
    done = subprocess.run(  # noqa: S603 - the project's own script
        [str(ROOT / "scripts" / "services.sh")], check=True, capture_output=True, text=True
    )
    return dict(line.split("=", 1) for line in done.stdout.strip().splitlines() if "=" in line)


def python(env: dict[str, str], *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` with this interpreter from the project root (`manage.py ...`, `-m harness.demo_world`);
    with `check`, a failure raises with its output."""
    done = subprocess.run(  # noqa: S603 - this interpreter, our own arguments
        [PYTHON, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done


def manage(env: dict[str, str], *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """`manage.py ARGS` with this interpreter; with `check`, a failure raises with its output."""
    return python(env, "manage.py", *args, check=check, timeout=timeout)


def flush_redis(url: str) -> None:
    """Empty a Redis database. Emptied, it has seen no signature: its replay memory is declared
    complete (exchange/api/ratelimit/replay.py), so the first signed writes are not refused."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    declare_complete(client)


def recreate_database(server: str, name: str, *, create: bool = True) -> None:
    """Drop the database `name` on the PostgreSQL `server` (a URL without database) and, with
    `create`, create it empty."""
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if create:
            admin.execute(f"CREATE DATABASE {name}")


def fresh_database(env: dict[str, str]) -> None:
    """An empty database at env's DATABASE_URL and an emptied Redis database at its REDIS_URL (no migrate)."""
    server, _, name = env["DATABASE_URL"].rpartition("/")
    recreate_database(server, name)
    flush_redis(env["REDIS_URL"])


@contextlib.contextmanager
def private_services(pg_server: str, redis_server: str, db_name: str, redis_db: int) -> Iterator[tuple[str, str]]:
    """A new, empty database `db_name` and the emptied Redis database `redis_db` on the shared
    servers: `(DATABASE_URL, REDIS_URL)`; dropped and emptied again on the way out."""
    redis_url = f"{redis_server}/{redis_db}"
    recreate_database(pg_server, db_name)
    flush_redis(redis_url)
    try:
        yield f"{pg_server}/{db_name}", redis_url
    finally:
        flush_redis(redis_url)
        recreate_database(pg_server, db_name, create=False)


def load_demo(env: dict[str, str]) -> dict:
    """Migrate the database of `env` and load the demo world (one process, `python -m harness.demo_world`);
    the world's JSON."""
    loaded = python(env, "-m", "harness.demo_world").stdout
    return json.loads(loaded.strip().splitlines()[-1])


def demo_keys(env: dict[str, str]) -> dict:
    """The demo world's accounts and keys (`manage.py demo --json`; idempotent)."""
    return json.loads(manage(env, "demo", "--json").stdout.strip().splitlines()[-1])


@dataclass
class Proc:
    proc: subprocess.Popen
    log: Path

    def tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:]


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], name: str, *, keep_log: bool = False) -> Iterator[Proc]:
    """`args` in a session of its own, output to a temporary log; stopped on the way out: the main
    process first (a warm shutdown), then whatever is left of its group."""
    log = Path(tempfile.mkstemp(prefix=f"stack-{name}-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own programs and arguments
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield Proc(proc, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode not in (0, -signal.SIGTERM, 143) and not keep_log:
            sys.stderr.write(f"{name} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        if not keep_log:
            log.unlink(missing_ok=True)
