"""The pytest side of the harness (exchange/stack): the tests that start real processes
(tests/streams/test_full_stack.py, tests/streams/test_revocation_full_stack.py,
tests/wallet/test_worker_crash.py, tests/stack/...) fail, never skip, without PostgreSQL and Redis;
each module names its own database and Redis database on the servers the test run uses (from the
environment, so that runs sharing one PostgreSQL and Redis do not collide); a Daphne server for the
streams' tests. Everything else (private databases, manage.py, the demo world, processes that are
always stopped, free ports) is exchange/stack's, re-exported here for the tests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exchange.stack import services
from exchange.stack.layout import ROOT
from exchange.stack.ports import free_port
from exchange.stack.ports import wait_for_port as _wait_for_port
from exchange.stack.services import PYTHON, Proc, load_demo, manage, process

__all__ = ("PYTHON", "ROOT", "Proc", "free_port", "load_demo", "manage", "process")

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


@contextlib.contextmanager
def private_services(db_name: str, redis_db: int) -> Iterator[tuple[str, str]]:
    """A new, empty PostgreSQL database `db_name` and the emptied Redis database `redis_db` on the
    test run's servers: `(DATABASE_URL, REDIS_URL)`; both dropped or emptied again on the way out."""
    with services.private_services(PG_SERVER, REDIS_SERVER, db_name, redis_db) as urls:
        yield urls


def wait_for_port(port: int, server: Proc, timeout: float = 30) -> None:
    """Until `server` listens on `port`; fails with its log if it exits or takes too long."""
    _wait_for_port(port, timeout, proc=server.proc, log=str(server.log))


# --- a websocket (Daphne) server ------------------------------------------------------------------

# The websocket servers' database (a suffix per module) and Redis database: 6-8, 10-15 serve other tests.
FULLSTACK_DB_NAME = os.environ.get("FULLSTACK_DATABASE_NAME", "exchange_fullstack_test")
FULLSTACK_REDIS_DB = int(os.environ.get("FULLSTACK_REDIS_DB", "9"))
# tests/streams/test_fairness.py's own (its flood must not share a server's database with the others).
FAIRNESS_DB_NAME = os.environ.get("FAIRNESS_DATABASE_NAME", "exchange_fairness_test")
FAIRNESS_REDIS_DB = int(os.environ.get("FAIRNESS_REDIS_DB", "6"))
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
    # As exchange/stack/programs.py: a storm of handshakes may take the app longer than Daphne's 5 s default.
    args += ["--websocket_connect_timeout", "30", "exchange.asgi:application"]
    with process(args, env, "daphne") as proc:
        wait_for_port(port, proc)
        yield Server(port, env, proc.proc, proc.log, world)
