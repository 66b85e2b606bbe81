"""The full stack in subprocesses, for the tests that start real processes
(tests/streams/test_full_stack.py, tests/streams/test_revocation_full_stack.py,
tests/wallet/test_worker_crash.py): are the services up, a private database loaded with the demo
world, a clean Redis database, manage.py, servers and workers as process groups that are always
stopped, a Daphne server.

Each module names its own database and Redis database (from the environment, so that runs sharing
one PostgreSQL and Redis do not collide) and drops and flushes what it used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# The servers the test run itself uses (var/services.env): the stack gets databases of its own there.
PG_SERVER = os.environ.get("DATABASE_URL", "postgres://exchange:exchange@127.0.0.1:5432/exchange").rsplit("/", 1)[0]
# The Redis server the full-stack tests' private databases are on (STACK_REDIS_SERVER: another one,
# e.g. tests/test_skips.py's unreachable server, while the test's own storage stays on REDIS_URL).
REDIS_SERVER = (
    os.environ.get("STACK_REDIS_SERVER") or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15").rsplit("/", 1)[0]
)


# `make test` starts PostgreSQL and Redis first; a server still starting gets this long to answer.
SERVICES_WAIT_SECONDS = float(os.environ.get("SERVICES_WAIT_SECONDS", "30"))


@functools.cache
def services_unreachable(pg_server: str, redis_url: str) -> str | None:
    """Why PostgreSQL (`pg_server`, a URL without database) or Redis cannot be reached within
    SERVICES_WAIT_SECONDS, or None. Asked once per run and servers."""
    import psycopg
    import redis

    deadline = time.monotonic() + SERVICES_WAIT_SECONDS
    while True:
        try:
            psycopg.connect(f"{pg_server}/postgres", connect_timeout=3).close()
            redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
            if time.monotonic() > deadline:
                return f"PostgreSQL/Redis not reachable after {SERVICES_WAIT_SECONDS} s: {exc}"
            time.sleep(1)
        else:
            return None


def requires_services(redis_db: int) -> pytest.MarkDecorator:
    """Marks tests that start processes on PostgreSQL and Redis (database `redis_db`): they fail, with
    the reason, when those cannot be reached; never skipped (fail_without_services, tests/conftest.py)."""
    return pytest.mark.requires_services(redis_db)


def fail_without_services(item: pytest.Item) -> None:
    """At the setup of a test marked `requires_services`: fail it when its servers are unreachable."""
    marker = item.get_closest_marker("requires_services")
    if marker is None:
        return
    why = services_unreachable(PG_SERVER, f"{REDIS_SERVER}/{marker.args[0]}")
    if why is not None:
        pytest.fail(f"{why} (`make services` starts them)", pytrace=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`manage.py ARGS` with this interpreter; with `check`, a failure fails the test with its output."""
    done = subprocess.run(  # noqa: S603 - this interpreter, our own arguments
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


def flush_redis(url: str) -> None:
    """Empty the stack's Redis database. Emptied, it has seen no signature: its replay memory is
    declared complete (exchange/api/ratelimit/replay.py), so the first signed writes are not refused."""
    import redis

    from exchange.api.replay_memory import declare_complete

    client = redis.Redis.from_url(url)
    client.flushdb()
    declare_complete(client)


def stack_env(*, settings: str = "exchange.settings.base", drop: tuple[str, ...] = (), **overrides: str) -> dict:
    """The environment of a process of the stack: this one's, without pytest's and the test
    database's variables, the rate-limit store and broker URLs (they follow REDIS_URL) and `drop`;
    production settings unless `settings`, no DEBUG, warnings only; then `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TEST_DATABASE"))}
    for name in ("RATE_LIMIT_STORAGE_URL", "CELERY_BROKER_URL", *drop):
        env.pop(name, None)
    env.update(DJANGO_SETTINGS_MODULE=settings, DEBUG="false", LOG_LEVEL="WARNING")
    env.update(overrides)
    return env


def _drop_and_create(name: str, *, create: bool) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if create:
            admin.execute(f"CREATE DATABASE {name}")


@contextlib.contextmanager
def private_services(db_name: str, redis_db: int) -> Iterator[tuple[str, str]]:
    """A new, empty PostgreSQL database `db_name` and the emptied Redis database `redis_db`:
    `(DATABASE_URL, REDIS_URL)`; both dropped or emptied again on the way out."""
    redis_url = f"{REDIS_SERVER}/{redis_db}"
    _drop_and_create(db_name, create=True)
    flush_redis(redis_url)
    try:
        yield f"{PG_SERVER}/{db_name}", redis_url
    finally:
        flush_redis(redis_url)
        _drop_and_create(db_name, create=False)


_LOAD_DEMO = (
    "from django.core.management import call_command as c; "
    "c('migrate', interactive=False, verbosity=0); c('demo', json=True)"
)


def load_demo(env: dict[str, str]) -> dict:
    """Migrate the stack's database and load the demo world (one process); the world's JSON."""
    loaded = manage(env, "shell", "--no-imports", "-c", _LOAD_DEMO).stdout
    return json.loads(loaded.strip().splitlines()[-1])


@dataclass
class Proc:
    proc: subprocess.Popen
    log: Path

    def tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:]


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], name: str) -> Iterator[Proc]:
    """`args` in a session of its own, output to a temporary log; stopped on the way out: the main
    process first (a warm shutdown), then whatever is left of its group."""
    log = Path(tempfile.mkstemp(prefix=f"stack-{name}-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - this interpreter, our own arguments
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
        log.unlink(missing_ok=True)


def wait_for_port(port: int, server: Proc, timeout: float = 30) -> None:
    """Until `server` listens on `port`; fails with its log if it exits or takes too long."""
    deadline = time.time() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if server.proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{server.proc.args[:3]} did not start:\n{server.tail()}")
        time.sleep(0.1)


# --- a websocket (Daphne) server ------------------------------------------------------------------

# The websocket servers' database (a suffix per module) and Redis database: 8, 10-15 serve other tests.
FULLSTACK_DB_NAME = os.environ.get("FULLSTACK_DATABASE_NAME", "exchange_fullstack_test")
FULLSTACK_REDIS_DB = int(os.environ.get("FULLSTACK_REDIS_DB", "9"))
PING_INTERVAL, PING_TIMEOUT = 1, 2  # seconds: Daphne's --ping-interval and --ping-timeout here


def daphne_env(**overrides: str) -> dict[str, str]:
    """The environment of a websocket server; FULLSTACK_SETTINGS runs it with another settings
    module (e.g. to try a fix)."""
    env = stack_env(settings=os.environ.get("FULLSTACK_SETTINGS", "exchange.settings.base"))
    # Hundreds of clients connect at once from 127.0.0.1 here: room above the per-IP cap's 100.
    env.setdefault("STREAM_MAX_CONNECTIONS_PER_IP", "1000")
    env.update(overrides)
    return env


@dataclass
class Server:
    port: int
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path
    world: dict

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, key: str) -> str:
        return f"ws://127.0.0.1:{self.port}/openapi/ws/{key}"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def headers(self) -> dict[str, str]:
        return {"X-SERVICE-APIKEY": self.world["master"]["api_key"]}

    def start_key(self) -> str:
        import requests

        response = requests.post(f"{self.http}/openapi/v1/userDataStream", headers=self.headers(), timeout=10)
        assert response.status_code == 200, response.text
        return response.json()["listenKey"]


@contextlib.contextmanager
def daphne(
    env: dict[str, str], world: dict, *, ping_interval: int = PING_INTERVAL, ping_timeout: int = PING_TIMEOUT
) -> Iterator[Server]:
    """Daphne serving the project's ASGI application (HTTP and websocket) on a free port, with the
    demo `world` it was loaded with."""
    port = free_port()
    args = [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    args += ["--ping-interval", str(ping_interval), "--ping-timeout", str(ping_timeout)]
    # As exchange/stack.py: a storm of handshakes may take the app longer than Daphne's 5 s default.
    args += ["--websocket_connect_timeout", "30", "exchange.asgi:application"]
    with process(args, env, "daphne") as proc:
        wait_for_port(port, proc)
        yield Server(port, env, proc.proc, proc.log, world)
