"""The pytest side of the harness (harness): the tests that start real processes
(tests/streams/test_full_stack.py, tests/streams/test_revocation_full_stack.py,
tests/wallet/test_worker_crash.py, tests/stack/...) fail, never skip, without PostgreSQL and Redis;
each module names its own database and Redis database on the servers the test run uses, per
pytest-xdist worker (exchange/settings/testnames.py; the environment's names are overrides, so that
runs sharing one PostgreSQL and Redis do not collide); the migrated demo world built once per run and
copied into a module's database (`load_demo`); a Daphne server for the streams' tests. Everything else
(private databases, manage.py, processes that are always stopped, free ports) is harness's,
re-exported here for the tests.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exchange.settings import testnames
from harness import services
from harness.layout import ROOT
from harness.ports import free_port
from harness.ports import wait_for_port as _wait_for_port
from harness.services import PYTHON, Proc, manage, process

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


# --- per-worker names ------------------------------------------------------------------------------
# The private databases and Redis databases of the modules that start processes: one set per xdist
# worker (a worker runs its modules one after the other, each emptying them before and after).
# FULLSTACK_DATABASE_NAME, CRASH_DATABASE_NAME, POOL_DATABASE_NAME and FULLSTACK_REDIS_DB,
# CRASH_REDIS_DB, POOL_REDIS_DB override the defaults (the worker's suffix is added to the names).
# A module that shares a prefix adds a suffix of its own (`f"{FULLSTACK_DB_NAME}_rev"`).
database_name = testnames.database_name
redis_db = testnames.redis_db
FULLSTACK_DB_NAME = database_name("exchange_fullstack_test", "FULLSTACK_DATABASE_NAME")
FULLSTACK_REDIS_DB = redis_db("fullstack")
CRASH_DB_NAME = database_name("exchange_crash_test", "CRASH_DATABASE_NAME")
CRASH_REDIS_DB = redis_db("crash")
POOL_DB_NAME = database_name("exchange_pool_test", "POOL_DATABASE_NAME")
POOL_REDIS_DB = redis_db("pool")


# --- the demo world, migrated once per run --------------------------------------------------------

# One per run and PostgreSQL server, shared by the workers (no worker suffix): built by the first
# worker that needs it, under an advisory lock, and marked with the run's id (xdist's
# PYTEST_XDIST_TESTRUNUID, else this process's), so a later run builds it again from its own code.
DEMO_TEMPLATE = os.environ.get("FULLSTACK_DATABASE_NAME", "exchange_fullstack_test") + "_template"
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


def _admin():
    import psycopg

    return psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=10)


@functools.cache
def demo_template(redis_url: str) -> tuple[str, dict]:
    """The run's template database, migrated with the demo world loaded, and that world's JSON
    (`manage.py demo --json`: the same keys in every copy)."""
    from psycopg import sql

    name = sql.Identifier(DEMO_TEMPLATE)
    with _admin() as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", [DEMO_TEMPLATE])
        try:
            row = admin.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", [DEMO_TEMPLATE]
            ).fetchone()
            with contextlib.suppress(TypeError, ValueError, KeyError):
                mark = json.loads(row[0])
                if mark["run"] == RUN_ID:
                    return DEMO_TEMPLATE, mark["world"]
            if row is not None:
                admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(name))
                admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
            env = stack_env(DATABASE_URL=f"{PG_SERVER}/{DEMO_TEMPLATE}", REDIS_URL=redis_url)
            world = services.load_demo(env)
            # No connection may reach it (autovacuum's included): CREATE DATABASE ... TEMPLATE needs it idle.
            admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(name))
            mark = sql.Literal(json.dumps({"run": RUN_ID, "world": world}))
            admin.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(name, mark))
            return DEMO_TEMPLATE, world
        finally:
            admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", [DEMO_TEMPLATE])


def drop_demo_template() -> None:
    """At the end of the run (the xdist controller, or the only process): the template goes, if this
    run built it (its mark names the run's id). A pytest that a test starts inside the run (e.g.
    tests/test_skips.py's) has a run id of its own and leaves the outer run's template alone: it
    used to drop it, and the outer run's later modules then failed on "template ... does not exist"."""
    from psycopg import sql

    with contextlib.suppress(Exception), _admin() as admin:
        row = admin.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", [DEMO_TEMPLATE]
        ).fetchone()
        mark = None
        with contextlib.suppress(TypeError, ValueError, KeyError):
            mark = json.loads(row[0])["run"]
        if row is not None and mark == RUN_ID:
            name = sql.Identifier(DEMO_TEMPLATE)
            admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(name))
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))


def load_demo(env: dict[str, str]) -> dict:
    """The demo world in env's database: on the test run's PostgreSQL a copy of the run's template
    (`CREATE DATABASE ... TEMPLATE`, a second; the database is made again), elsewhere (SQLite)
    migrate and `manage.py demo` in a process; the world's JSON."""
    server, _, name = env["DATABASE_URL"].rpartition("/")
    if server != PG_SERVER:
        return services.load_demo(env)
    from psycopg import sql

    template, world = demo_template(env["REDIS_URL"])
    with _admin() as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    return world


# --- a websocket (Daphne) server ------------------------------------------------------------------

# tests/streams/test_fairness.py's own database (its flood must not share a server's database with the
# others); the worker's fullstack Redis database, which private_services empties before and after (a
# worker runs its modules one after the other).
FAIRNESS_DB_NAME = f"{FULLSTACK_DB_NAME}_fairness"
FAIRNESS_REDIS_DB = FULLSTACK_REDIS_DB
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
    # As harness/programs.py: a storm of handshakes may take the app longer than Daphne's 5 s default.
    args += ["--websocket_connect_timeout", "30", "exchange.asgi:application"]
    with process(args, env, "daphne") as proc:
        wait_for_port(port, proc)
        yield Server(port, env, proc.proc, proc.log, world)


# --- connections left open ------------------------------------------------------------------------


def other_connections(connection) -> list[str]:
    """The other sessions on `connection`'s PostgreSQL database (a Django connection): pid, state,
    application and the last statement of each; [] elsewhere (SQLite)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, application_name, backend_start, left(query, 300) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY backend_start"
        )
        rows = cursor.fetchall()
    return [f"pid {pid} ({state}, {app!r}, since {start:%H:%M:%S}): {query}" for pid, state, app, start, query in rows]


def end_other_connections(connection) -> None:
    """End the other sessions on `connection`'s PostgreSQL database (at the end of a run, named first)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
