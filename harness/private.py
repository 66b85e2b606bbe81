"""A stack of one's own: a private PostgreSQL cluster and a private Redis (AOF persistence), migrated
and loaded with `manage.py demo`, and the stack exactly as `make run` starts it on a free block of
ports. What the chaos runner and the simulation drive; their faults restart these servers and kill
the stack's programs, which disturbs nobody else.

Why Redis keeps an AOF: a production Redis that holds the Celery broker's queues and the listenKeys
runs with it, and a restart then keeps what it held (queued and unacknowledged task messages,
listenKeys and their TTLs, channel-layer groups, the replay memory); SHUTDOWN writes it before Redis
exits, so nothing acknowledged is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import psycopg

from exchange.api.replay_memory import declare_complete
from harness.layout import Layout, stack_env
from harness.ports import HOST, free_block, free_port, wait_until
from harness.run import prepare
from harness.services import manage
from harness.supervisor import Supervisor


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin directory."""
    base = Path("/usr/lib/postgresql")
    found = [p for p in base.iterdir() if (p / "bin" / "initdb").exists()] if base.exists() else []
    if not found:
        raise RuntimeError("no PostgreSQL under /usr/lib/postgresql (make services installs it)")
    return max(found, key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()]) / "bin"


class PrivatePostgres:
    """A PostgreSQL cluster of our own in `base`/pg (data, log and unix socket), run by the
    `postgres` OS user when we are root; trust authentication, 127.0.0.1 only."""

    def __init__(self, base: Path, port: int, max_connections: int = 100) -> None:
        self.bin = postgres_bin()
        self.home = base / "pg"
        self.data = self.home / "data"
        self.log = self.home / "postgres.log"
        self.port = port
        self.max_connections = max_connections
        self.running = False

    @property
    def version(self) -> str:
        return self.bin.parent.name

    def _as_owner(self, *args: str, timeout: float = 120) -> str:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run(  # noqa: S603 - PostgreSQL's own programs, our arguments
            [*prefix, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def init(self) -> None:
        self.home.mkdir(parents=True)
        if os.geteuid() == 0:
            self.home.parent.chmod(0o755)  # the postgres user walks through it
            shutil.chown(self.home, "postgres", "postgres")
        self._as_owner(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.home} -c listen_addresses={HOST} -c max_connections={self.max_connections}"
        self._as_owner(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._as_owner(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def url(self, database: str, user: str = "exchange", password: str = "exchange") -> str:  # noqa: S107 - trust auth
        return f"postgres://{user}:{password}@{HOST}:{self.port}/{database}"

    def create_database(self, name: str, owner: str = "exchange") -> None:
        with psycopg.connect(f"postgresql://postgres@{HOST}:{self.port}/postgres", autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {owner} LOGIN CREATEDB PASSWORD '{owner}'")
            admin.execute(f"CREATE DATABASE {name} OWNER {owner}")

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(Exception):
                self.stop("immediate")


class PrivateRedis:
    """redis-server of our own on `port`, with AOF persistence in `base`/redis (see the module's
    docstring for why)."""

    def __init__(self, base: Path, port: int) -> None:
        self.dir = base / "redis"
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def client(self):
        import redis

        return redis.Redis(host=HOST, port=self.port, socket_timeout=5, socket_connect_timeout=2)

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--port", str(self.port), "--bind", HOST, "--dir", str(self.dir)]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction"]
        args += ["--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(  # noqa: S603 - redis-server, our arguments
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

        def answers() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with contextlib.suppress(Exception):
                return bool(self.client().ping())
            return False

        wait_until(answers, 30, "redis-server answering")

    def stop(self) -> None:
        """SHUTDOWN: Redis writes its AOF and exits. Sent on a plain socket: redis-py's client retries
        (with back-off, seconds) the connection that SHUTDOWN closes."""
        with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=5) as sock:
            sock.sendall(b"*1\r\n$8\r\nSHUTDOWN\r\n")
            while sock.recv(1024):
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def destroy(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stack_environment(database_url: str, redis_url: str, port: int, run_dir: Path) -> dict[str, str]:
    """This process's environment less what belongs to a test run, with the private services,
    the limits out of the way and the sweeps' thresholds short."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TEST_DATABASE", "STACK_"))}
    for name in ("RATE_LIMIT_STORAGE_URL", "CELERY_BROKER_URL", "CELERY_TASK_ALWAYS_EAGER", "EMBEDDED_SCHEDULER"):
        env.pop(name, None)
    env.update(
        DJANGO_SETTINGS_MODULE="exchange.settings.base",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DEBUG="false",
        LOG_LEVEL="WARNING",
        PORT=str(port),
        STACK_RUN_DIR=str(run_dir),
        IP_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        UID_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        WITHDRAWAL_RETRY_AFTER_SECONDS="5",
        FUND_COLLECTION_RETRY_AFTER_SECONDS="5",
    )
    return stack_env(env)


def process_children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


class Book:
    """The stack's database as the driver reads it: one connection, opened again when it breaks
    (PostgreSQL restarts under it); used from worker threads (asyncio.to_thread)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def rows(self, sql: str, args=None) -> list[tuple]:
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3)
                    return self._conn.execute(sql, args).fetchall()
                except psycopg.OperationalError:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise
        return []

    def one(self, sql: str, args=None):
        rows = self.rows(sql, args)
        return rows[0] if rows else None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._conn is not None:
                self._conn.close()


class Stack:
    """What a run drives, wherever it runs: `start` brings it up and answers the demo world; then its
    public face: `port` (the one port the clients use), `env` (the programs' environment, with
    DATABASE_URL and REDIS_URL), `run_dir`, `book` (its database), `layout` and `supervisor` (its
    programs, a program's pid, their restarts); `describe` and `stop`. Two of them: PrivateStack (private
    servers) and the lab's (harness/lab/fault.py: LabStack)."""

    port: int
    run_dir: Path
    env: dict[str, str]
    book: Book
    layout: Layout
    supervisor: Supervisor

    def start(self, database: str, *demo_args: str, **env: str) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def launch(self, run_dir: Path, database_url: str, redis_url: str, *demo_args: str, **env: str) -> dict:
        """The stack on `database_url` and `redis_url` (migrated, `manage.py demo <demo_args>` loaded) on
        a free block of ports, its files in `run_dir`; the demo world's JSON (its last line)."""
        self.port = free_block()
        self.run_dir = run_dir
        self.env = stack_environment(database_url, redis_url, self.port, self.run_dir) | env
        for args in (("migrate", "--noinput", "-v", "0"), ("demo", *demo_args)):
            done = manage(self.env, *args)
        self.book = Book(self.env["DATABASE_URL"])
        self.layout = Layout.from_env(self.env, port=self.port, run_dir=self.run_dir)
        programs = prepare(self.env, self.layout)
        self.supervisor = Supervisor(programs, self.env, self.run_dir, log=self.run_dir / "stack.log")
        self.supervisor.start()
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop_programs(self) -> None:
        """The stack's programs stopped and the book closed (the servers they ran on left as they are)."""
        for step in (lambda: self.supervisor.stop(), lambda: self.book.close()):
            with contextlib.suppress(Exception):
                step()


class PrivateStack(Stack):
    """Private PostgreSQL (`pg`) and Redis (`redis`, AOF) in `base`, migrated and loaded with `manage.py
    demo`, and the stack exactly as `make run` starts it (nginx, granian, Daphne, Celery worker and
    beat) on a free block of ports: what the fault script and the simulation (harness/simulation) both
    drive; their faults restart `pg` and `redis`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.pg: PrivatePostgres | None = None
        self.redis: PrivateRedis | None = None

    def start(self, database: str, *demo_args: str, **env: str) -> dict:
        """Everything up; the demo world `manage.py demo <demo_args>` printed (its last line, JSON)."""
        self.pg = PrivatePostgres(self.base, free_port())
        self.pg.init()
        self.pg.start()
        self.pg.create_database(database)
        self.redis = PrivateRedis(self.base, free_port())
        self.redis.start()
        # Empty, the store has seen no signature: its replay memory is complete (exchange/api/ratelimit/replay.py).
        declare_complete(self.redis.client())
        return self.launch(self.base / "stack", self.pg.url(database), self.redis.url, *demo_args, **env)

    def describe(self) -> str:
        return (
            f"stack up on {HOST}:{self.port} (nginx): granian {self.layout.rest_workers} x {self.layout.rest_threads}, "
            f"Daphne x {len(self.layout.ws_ports)}, Celery worker ({self.layout.celery_concurrency}) and beat; "
            f"PostgreSQL {self.pg.version} on {self.pg.port}, Redis on {self.redis.port} (appendonly yes)"
        )

    def stop(self) -> None:
        self.stop_programs()
        for step in (lambda: self.redis.destroy(), lambda: self.pg.destroy()):
            with contextlib.suppress(Exception):
                step()
