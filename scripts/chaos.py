#!/usr/bin/env python3
"""Faults under load against the full stack (issue 16, item 4): the stack `make run` starts
(exchange/stack.py: nginx in front of granian and Daphne, a Celery worker and beat) on a PRIVATE
PostgreSQL cluster and a PRIVATE Redis, driven through nginx's one port while Redis is restarted,
PostgreSQL is restarted and the Celery worker is SIGKILLed (its pool children, and once the whole
worker), one after the other in a seeded order.

    .venv/bin/python scripts/chaos.py [--seed N] [--keep]     # prints a report; exit 1 on a broken rule

tests/stack/test_faults.py runs the same driver (`run()`) and asserts on its result.

1. Services of its own, so that restarting them disturbs nobody: `initdb` into a temporary directory
   as the `postgres` OS user (`runuser -u postgres --`; the newest /usr/lib/postgresql/<v>/bin), on a
   free port with its unix socket in that directory, max_connections 100; `redis-server` on a free
   port WITH persistence (appendonly yes, appendfsync everysec, no RDB snapshots, noeviction), its
   files in that directory. Persistence is chosen because a production Redis that holds the Celery
   broker's queues and the listenKeys runs with AOF, and a restart then keeps what it held: queued
   and unacknowledged task messages, listenKeys and their TTLs, channel-layer groups, and the replay
   memory (the signatures seen, and the memory epoch, docs/security.md). SHUTDOWN writes the AOF
   before Redis exits, so nothing acknowledged is lost. (Without persistence the queues would be
   lost, the beat's sweeps would have to rescue every withdrawal and collection and every listenKey
   would die.) Either way signed writes meet two seconds of -1021 once Redis is back: the service
   sees another server process and starts its replay memory again (a crash could have lost its
   last second).
   Then `manage.py migrate` and `manage.py demo --json` with DJANGO_SETTINGS_MODULE=exchange.settings.base.
2. The stack as `make run` starts it: `Layout.from_env` on a free block of ports and a temporary run
   directory, `prepare()`, `Supervisor(...).start()` and its `watch()` in a thread (it starts again
   a program that exits), with the rate limits out of the way and WITHDRAWAL_RETRY_AFTER_SECONDS and
   FUND_COLLECTION_RETRY_AFTER_SECONDS at 5, so that the beat's sweeps (every 30 s) finish the work
   of a killed worker. Its output goes to <run dir>/stack.log.
3. Load through nginx for the whole run: CLIENTS signed keep-alive clients sending USDT transfers
   between the demo master and peer (each request with a unique client_transfer_id and a unique
   amount), 3 websockets on the peer's listenKey, and a withdrawal every second plus a universal
   transfer to a sub-account and a fund collection every third second; every answer is recorded,
   and every request whose outcome the client cannot know (connection broken, 5xx, no answer).
4. The faults, each with load running: Redis shut down, away a few seconds, started again on its
   AOF; PostgreSQL stopped (`pg_ctl stop -m fast`), away a few seconds, started again; the worker's
   pool children SIGKILLed while withdrawals and a collection are in flight (the worker forks new
   ones and the messages are handed to them); the whole worker SIGKILLed likewise (the Supervisor
   starts it again; the beat's sweeps hand the unacknowledged work to it).
5. The rules (any broken one fails the run):
   - during and after every fault the service answers 200 or 503 with -1001, never a 500 (-1000) or
     another 5xx, and no request goes unanswered for HUNG_SECONDS; after the fault the clients get
     a 200 again within RECOVERY_SECONDS;
   - at the end, load stopped: `manage.py ledger_check` passes; every transfer answered 200 exists
     exactly once with the id answered; every refused one (4xx) does not exist; every unknown
     outcome is resolved by querying (GET .../transfers?client_transfer_id=, and the database) as
     done or not done, never twice;
   - every withdrawal and collection reached a final state and settled exactly once: a withdrawal's
     postings are `withdrawal:<id>:hold` and one of `:settle`/`:release` matching its stage, with at
     most one broadcast; a collection has one outcome per sub-account and one posting per collected
     sub-account (`fund-collect:<id>:<sub>`);
   - every websocket that stayed connected received exactly one outboundAccountPosition per posting
     that touched the peer while it listened (the change feed, accounts_balancechange, from the
     peer's sequence when it connected), in order, the last with the database's balance. A
     connection the server closed reconnects with a listenKey asked for again and starts counting
     afresh; what it received before the close must be a gapless run of the feed. Reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import _load  # noqa: E402 - bench/_load.py: Signer, HttpConnection, Listener
import psycopg  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from exchange.api.replay_memory import declare_complete  # noqa: E402
from exchange.stack import Layout, Supervisor, prepare, stack_env  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
HOST = "127.0.0.1"
CLIENTS = 8
LISTENERS = 3
CLIENT_RATE = 10.0  # transfers a second per client (80 in all): leaves room for the faults on 2 cores
HUNG_SECONDS = 30.0  # a request without an answer this long is hung
RECOVERY_SECONDS = 60.0  # after a fault's end, a 200 within this long
SETTLE_SECONDS = 150.0  # at the end, withdrawals and collections final within this long
AFTER_SECONDS = 12.0  # load watched after each fault before the next one
WARMUP_SECONDS = 5.0
TRANSFER = "/openapi/transfer/v4/transfers"
TRANSFER_QUERY = "/openapi/transfer/v3/transfers"
WITHDRAW = "/openapi/wallet/v1/withdraw/apply"
UNIVERSAL = "/openapi/v1/sub-account/transfer/universal-transfer"
COLLECT = "/openapi/v1/fund-collect/collect-from-sub-account"
LISTEN_KEY = "/openapi/v1/userDataStream"
ETH_ADDRESS = "0x00000000000000000000000000000000000d3e40"  # the demo master's ETH whitelist entry
FINAL_WITHDRAWAL = ("SUCCEEDED", "FAILED")
FINAL_COLLECTION = ("SUCCESS", "PARTIAL_SUCCESS", "FAILED")


def now() -> float:
    return time.monotonic()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_block(size: int = 3) -> int:
    """A free port whose next `size - 1` are free too (nginx, REST, websocket)."""
    for _ in range(200):
        port = free_port()
        if port + size < 65535 and all(_port_free(port + i) for i in range(size)):
            return port
    raise RuntimeError("no block of free ports")


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    deadline = now() + timeout
    while not check():
        if now() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(step)


# --- private services --------------------------------------------------------------------------------


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


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603 - the project's interpreter, our own arguments
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


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


# --- what the clients saw ----------------------------------------------------------------------------


@dataclass
class Answer:
    """One request and what came back; status None: no answer (connection broken, or hung)."""

    kind: str  # transfer, withdrawal, universal, collection
    ident: str  # the client's id of the request (client_transfer_id, withdrawOrderId, ...)
    role: str  # demo account that sent it
    started: float
    ended: float
    status: int | None
    code: int | None = None
    ref: str | None = None  # what a 200 answered: the transfer's or withdrawal's id, the collection's status
    hung: bool = False
    query: str = ""  # the signed query text sent (scripts/simulate.py replays it)

    @property
    def label(self) -> str:
        if self.status is None:
            return "hung" if self.hung else "no answer"
        return "200" if self.status == 200 else f"{self.status}/{self.code}"

    @property
    def unknown(self) -> bool:
        """The client cannot know whether it was executed: no answer, or a server error."""
        return self.status is None or self.status >= 500

    @property
    def breaks_a_rule(self) -> bool:
        """An answer the service must never give: a 5xx other than 503 -1001 (or, for a listenKey,
        503 -1126, docs/streams.md), e.g. a 500 -1000 (a traceback), or none within HUNG_SECONDS."""
        if self.hung:
            return True
        allowed = {(503, -1001), (503, -1126)} if self.kind == "listenkey" else {(503, -1001)}
        return self.status is not None and self.status >= 500 and (self.status, self.code) not in allowed


def tally(answers: list[Answer]) -> str:
    counts = Counter(a.label for a in answers)
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + "}" if counts else "{}"


class PositionFeed(_load.Listener):
    """bench/_load's Listener keeping each outboundAccountPosition whole: (u, ((asset, free,
    locked), ...)), the key the change feed is matched with."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.received: list[tuple] = []
        self.error: str | None = None

    async def _run(self) -> None:
        try:
            async for raw in self._ws:
                event = json.loads(raw)
                if event.get("e") == "outboundAccountPosition":
                    balances = tuple((b["a"], Decimal(b["f"]), Decimal(b["l"])) for b in event["B"])
                    self.received.append((int(event["u"]), balances))
        except ConnectionClosed as exc:
            self.closed_with = exc.rcvd.code if exc.rcvd else 1006
        except Exception as exc:  # noqa: BLE001 - any end of the connection is recorded
            self.error = repr(exc)
        else:
            self.closed_with = self._ws.close_code


@dataclass
class Segment:
    """One websocket connection of a listener slot: the peer's feed sequence read just before it
    connected (lo) and just after the handshake (hi): the server's starting point lies between."""

    slot: int
    seq_lo: int
    seq_hi: int
    opened: float
    feed: PositionFeed
    closed: float | None = None  # set when the server closed it (not us at the end)
    closed_with: str = ""
    verdict: str = ""
    ok: bool = True
    account: str = ""  # whose listenKey (scripts/simulate.py: one slot per customer)


@dataclass
class Fault:
    name: str
    start: float = 0.0  # the outage window, time.monotonic()
    end: float = 0.0
    until: float = 0.0  # watched after the window until then (the next fault, or the end of the load)
    steps: list[str] = field(default_factory=list)
    in_flight: dict[str, list] = field(default_factory=dict)  # withdrawals / collections not final at the kill
    settled_after: float | None = None  # seconds from the kill until all of them were final
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ChaosResult:
    seed: int
    faults: list[Fault]
    checks: list[Check]
    problems: list[str]
    report: str
    answers: list[Answer]
    segments: list[Segment]
    restarts: dict[str, int]
    log_dir: Path | None

    @property
    def ok(self) -> bool:
        return not self.problems


class PrivateStack:
    """Private PostgreSQL and Redis (AOF), migrated and loaded with `manage.py demo`, and the stack
    exactly as `make run` starts it (nginx, granian, Daphne, Celery worker and beat) on a free block
    of ports: what the fault script and the simulation (scripts/simulate.py) both drive."""

    def start_stack(self, base: Path, database: str, *demo_args: str, **env: str) -> dict:
        """Everything up; the demo world `manage.py demo <demo_args>` printed (its last line, JSON)."""
        self.base = base
        self.pg = PrivatePostgres(base, free_port())
        self.pg.init()
        self.pg.start()
        self.pg.create_database(database)
        self.redis = PrivateRedis(base, free_port())
        self.redis.start()
        # Empty, the store has seen no signature: its replay memory is complete (exchange/api/ratelimit/replay.py).
        declare_complete(self.redis.client())
        self.port = free_block()
        self.run_dir = base / "stack"
        self.env = stack_environment(self.pg.url(database), self.redis.url, self.port, self.run_dir) | env
        for args in (("migrate", "--noinput", "-v", "0"), ("demo", *demo_args)):
            done = manage(self.env, *args)
            if done.returncode != 0:
                raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        self.book = Book(self.env["DATABASE_URL"])
        self.layout = Layout.from_env(self.env, port=self.port, run_dir=self.run_dir)
        programs = prepare(self.env, self.layout)
        self.stack_log = (self.run_dir / "stack.log").open("w", buffering=1)
        self.supervisor = Supervisor(programs, self.env, out=self.stack_log)
        self.supervisor.start()
        threading.Thread(target=self.supervisor.watch, daemon=True, name="supervisor").start()
        return json.loads(done.stdout.strip().splitlines()[-1])

    def describe(self) -> str:
        return (
            f"stack up on {HOST}:{self.port} (nginx): granian {self.layout.rest_workers} x {self.layout.rest_threads}, "
            f"Daphne x {len(self.layout.ws_ports)}, Celery worker ({self.layout.celery_concurrency}) and beat; "
            f"PostgreSQL {self.pg.version} on {self.pg.port}, Redis on {self.redis.port} (appendonly yes)"
        )

    def stop(self) -> None:
        for step in (
            lambda: self.supervisor.stop(),
            lambda: self.stack_log.close(),
            lambda: self.book.close(),
            lambda: self.redis.destroy(),
            lambda: self.pg.destroy(),
        ):
            with contextlib.suppress(Exception):
                step()


async def send(conn: _load.HttpConnection, method: str, target: str, api_key: str) -> tuple[int | None, bytes, bool]:
    """One request on `conn`: (status, body, hung); status None when no answer came (the connection
    is closed then, so that the next request opens a new one)."""
    try:
        status, body = await asyncio.wait_for(conn.request(method, target, {"X-SERVICE-APIKEY": api_key}), HUNG_SECONDS)
        return status, body, False
    except TimeoutError:
        await conn.close()
        return None, b"", True
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError, IndexError):
        await conn.close()
        return None, b"", False


# --- the driver --------------------------------------------------------------------------------------


class Chaos(PrivateStack):
    def __init__(self, seed: int, out) -> None:
        self.seed = seed
        self.rng = random.Random(seed)  # noqa: S311 - the fault schedule, not a secret
        self.out = out
        self.answers: list[Answer] = []
        self.segments: list[Segment] = []
        self.faults: list[Fault] = []
        self.counter = itertools.count()
        self.t0 = now()
        self.t0_clock = time.strftime("%H:%M:%S")
        self.load_end = 0.0
        self.handshake_refusals: Counter = Counter()

    def say(self, text: str) -> None:
        self.out.write(f"[chaos +{now() - self.t0:6.1f}s] {text}\n")
        self.out.flush()

    def rel(self, moment: float) -> str:
        """A moment as seconds since the load started."""
        return f"{moment - self.t0:+.1f} s"

    # --- set-up -----------------------------------------------------------------------------------

    def start(self, base: Path) -> None:
        self.world = self.start_stack(base, "chaos", "--json")
        self.ids = {
            role: self.book.one("SELECT id FROM accounts_user WHERE email = %s", [self.world[role]["email"]])[0]
            for role in ("master", "peer")
        }
        self.signers = {
            role: _load.Signer(self.world[role]["api_key"], self.world[role]["secret_key"])
            for role in ("master", "peer")
        }
        self.say(self.describe())

    # --- requests ---------------------------------------------------------------------------------

    async def call(
        self, conn: _load.HttpConnection, role: str, method: str, path: str, params: dict, *, kind: str, ident: str
    ) -> Answer:
        signer = self.signers[role]
        started = now()
        status, body, hung = await send(conn, method, f"{path}?{signer.signed(params)}", signer.api_key)
        answer = Answer(kind, ident, role, started, now(), status, hung=hung)
        if status is not None:
            data = None
            with contextlib.suppress(ValueError):
                data = json.loads(body)
            if not isinstance(data, dict):
                data = {}
            if status != 200:
                answer.code = data.get("code")
            elif kind == "transfer":
                answer.ref = str(data.get("transfer", {}).get("id"))
            elif kind == "withdrawal":
                answer.ref = str(data.get("id"))
            elif kind == "universal":
                answer.ref = "true" if data.get("result") else "false"
            elif kind == "collection":
                answer.ref = data.get("status")
        self.answers.append(answer)
        return answer

    async def transfer_client(self, index: int, stopping: asyncio.Event) -> None:
        role, other = ("master", "peer") if index % 2 == 0 else ("peer", "master")
        target = self.world[other]["email"]
        conn = _load.HttpConnection(HOST, self.port)
        pace = 1.0 / CLIENT_RATE
        try:
            while not stopping.is_set():
                n = next(self.counter)
                ident = f"chaos{self.seed}-t{n}"
                # A unique amount per request: the peer's balance after each posting tells it apart.
                amount = Decimal("0.01") + Decimal(n) * Decimal("0.000001")
                params = {
                    "account": "USDT",
                    "target_address": target,
                    "amount": f"{amount:f}",
                    "client_transfer_id": ident,
                }
                started = now()
                answer = await self.call(conn, role, "POST", TRANSFER, params, kind="transfer", ident=ident)
                if answer.status is None:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(max(0.0, pace - (now() - started)))
        finally:
            await conn.close()

    async def withdraw(self, n: int) -> Answer:
        conn = _load.HttpConnection(HOST, self.port)
        try:
            ident = f"cw{self.seed}-{n}"[:30]
            params = {
                "coin": "ETH",
                "network": "ETH",
                "address": ETH_ADDRESS,
                "amount": "0.01",
                "withdrawOrderId": ident,
            }
            return await self.call(conn, "master", "POST", WITHDRAW, params, kind="withdrawal", ident=ident)
        finally:
            await conn.close()

    async def collect(self, n: int) -> tuple[Answer, Answer]:
        """A universal transfer master -> sub1 (so there is something to collect), then a collection."""
        conn = _load.HttpConnection(HOST, self.port)
        try:
            ident = f"chaos{self.seed}-u{n}"
            params = {"toEmail": self.world["sub"]["email"], "asset": "USDT", "amount": "1", "clientTranId": ident}
            moved = await self.call(conn, "master", "POST", UNIVERSAL, params, kind="universal", ident=ident)
            ident = f"chaos{self.seed}-c{n}"
            params = {"clientRequestId": ident}
            return moved, await self.call(conn, "master", "POST", COLLECT, params, kind="collection", ident=ident)
        finally:
            await conn.close()

    async def money_out(self, stopping: asyncio.Event) -> None:
        """A withdrawal every second; a universal transfer and a collection every third second."""
        for n in itertools.count():
            if stopping.is_set():
                return
            started = now()
            jobs = [self.withdraw(n)]
            if n % 3 == 0:
                jobs.append(self.collect(n))
            await asyncio.gather(*jobs)
            await asyncio.sleep(max(0.0, 1.0 - (now() - started)))

    async def burst(self) -> None:
        """Work for the worker right before it is killed: 4 withdrawals and a collection."""
        base = 100000 + len(self.faults) * 100
        await asyncio.gather(*[self.withdraw(base + i) for i in range(4)], self.collect(base))

    # --- the database, from the loop ------------------------------------------------------------------

    async def rows(self, sql: str, args=None) -> list[tuple]:
        return await asyncio.to_thread(self.book.rows, sql, args)

    async def peer_seq(self) -> int:
        """The peer's change-feed sequence; waits while the database is away."""
        while True:
            try:
                return (
                    await self.rows("SELECT seq FROM accounts_ledgeraccount WHERE user_id = %s", [self.ids["peer"]])
                )[0][0]
            except psycopg.Error:
                await asyncio.sleep(0.5)

    async def open_work(self) -> dict[str, list]:
        """Our withdrawals and collections not final yet: {"withdrawals": [(id, stage)], ...}."""
        withdrawals = await self.rows(
            "SELECT id, stage FROM wallet_withdrawal WHERE withdraw_order_id LIKE %s AND NOT stage = ANY(%s)"
            " ORDER BY id",
            [f"cw{self.seed}-%", list(FINAL_WITHDRAWAL)],
        )
        collections = await self.rows(
            "SELECT id, status FROM subaccounts_fundcollection WHERE client_request_id LIKE %s"
            " AND NOT status = ANY(%s) ORDER BY id",
            [f"chaos{self.seed}-c%", list(FINAL_COLLECTION)],
        )
        return {"withdrawals": withdrawals, "collections": collections}

    # --- websockets -----------------------------------------------------------------------------------

    async def listen_key(self) -> str | None:
        """POST /openapi/v1/userDataStream with the peer's key (recorded like every request); the
        listenKey, or None when refused."""
        conn = _load.HttpConnection(HOST, self.port)
        started = now()
        try:
            status, body, hung = await send(conn, "POST", LISTEN_KEY, self.signers["peer"].api_key)
        finally:
            await conn.close()
        answer = Answer("listenkey", "", "peer", started, now(), status, hung=hung)
        self.answers.append(answer)
        with contextlib.suppress(ValueError, AttributeError, KeyError):
            data = json.loads(body)
            if status == 200:
                return data["listenKey"]
            answer.code = data.get("code")
        return None

    async def listener_slot(self, slot: int, stop: asyncio.Event) -> None:
        """One websocket on the peer's listenKey for the whole run; connects again (asking for the
        listenKey again) whenever the server closes it."""
        while not stop.is_set():
            lo = await self.peer_seq()
            key = await self.listen_key()
            if key is None:
                await asyncio.sleep(0.5)
                continue
            feed = PositionFeed(f"ws://{HOST}:{self.port}/openapi/ws/{key}")
            try:
                await feed.start()
            except Exception as exc:  # noqa: BLE001 - refused at the handshake or unreachable: try again
                status = getattr(getattr(exc, "response", None), "status_code", None)
                self.handshake_refusals[f"HTTP {status}" if status else type(exc).__name__] += 1
                await asyncio.sleep(0.5)
                continue
            segment = Segment(slot, lo, await self.peer_seq(), now(), feed)
            self.segments.append(segment)
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({feed._task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if feed._task.done() and not stop.is_set():
                segment.closed = now()
                segment.closed_with = str(feed.closed_with) if feed.closed_with is not None else (feed.error or "?")
                self.say(f"websocket {slot}: closed by the server ({segment.closed_with}); connecting again")
                await asyncio.sleep(0.2)
                continue
            await feed.stop()

    # --- faults -----------------------------------------------------------------------------------------

    async def fault_redis(self, fault: Fault) -> None:
        away = self.rng.uniform(3.0, 6.0)
        fault.start = now()
        await asyncio.to_thread(self.redis.stop)
        down = now()
        await asyncio.sleep(away)
        await asyncio.to_thread(self.redis.start)
        fault.end = now()
        fault.steps.append(
            f"Redis SHUTDOWN (AOF written) took {down - fault.start:.1f} s, away {away:.1f} s, "
            f"started again on its AOF in {fault.end - down - away:.1f} s"
        )

    async def fault_postgres(self, fault: Fault) -> None:
        away = self.rng.uniform(3.0, 6.0)
        fault.start = now()
        await asyncio.to_thread(self.pg.stop, "fast")
        down = now()
        await asyncio.sleep(away)
        await asyncio.to_thread(self.pg.start)
        fault.end = now()
        fault.steps.append(
            f"pg_ctl stop -m fast took {down - fault.start:.1f} s, away {away:.1f} s, "
            f"pg_ctl start took {fault.end - down - away:.1f} s"
        )

    async def _work_in_hand(self, after: tuple[int, int], timeout: float = 3.0) -> None:
        """Until a withdrawal or collection newer than `after` (the highest ids before the burst) is
        BROADCASTING or PROCESSING (a pool child holds it), or timeout."""
        deadline = now() + timeout
        while now() < deadline:
            busy = await self.rows(
                "SELECT (SELECT count(*) FROM wallet_withdrawal WHERE id > %s AND stage = 'BROADCASTING')"
                " + (SELECT count(*) FROM subaccounts_fundcollection WHERE id > %s AND status = 'PROCESSING')",
                list(after),
            )
            if busy[0][0]:
                return
            await asyncio.sleep(0.005)

    async def _kill_with_work_in_flight(self, fault: Fault, kill: Callable[[], str]) -> None:
        """A burst of work, and the kill as soon as a pool child holds some of it."""
        after = (
            await self.rows(
                "SELECT (SELECT coalesce(max(id), 0) FROM wallet_withdrawal),"
                " (SELECT coalesce(max(id), 0) FROM subaccounts_fundcollection)"
            )
        )[0]
        burst = asyncio.create_task(self.burst())
        await self._work_in_hand(after)
        fault.start = now()
        fault.steps.append(kill())
        fault.in_flight = await self.open_work()
        await burst
        self.spawn(self._track_settling(fault))

    async def fault_worker_children(self, fault: Fault) -> None:
        worker = self.supervisor.pid("worker")
        killed: list[int] = []

        def kill() -> str:
            killed.extend(process_children(worker))
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return f"SIGKILL to the worker's {len(killed)} pool children {killed}"

        await self._kill_with_work_in_flight(fault, kill)
        want = self.layout.celery_concurrency
        while len([p for p in process_children(worker) if p not in killed]) < want and now() - fault.start < 60:
            await asyncio.sleep(0.05)
        fault.end = now()
        fault.steps.append(f"the worker had {want} new pool children after {fault.end - fault.start:.1f} s")

    async def fault_worker_whole(self, fault: Fault) -> None:
        old = self.supervisor.pid("worker")

        def kill() -> str:
            pool = process_children(old)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old, signal.SIGKILL)
            return f"SIGKILL to the whole worker (process group of {old}, pool {pool})"

        await self._kill_with_work_in_flight(fault, kill)
        while now() - fault.start < 90:
            pid = self.supervisor.procs["worker"].pid
            if pid != old and len(process_children(pid)) >= self.layout.celery_concurrency:
                break
            await asyncio.sleep(0.1)
        fault.end = now()
        pid = self.supervisor.procs["worker"].pid
        if pid == old:
            fault.problems.append(f"{fault.name}: the Supervisor did not start the worker again")
        fault.steps.append(
            f"the Supervisor started the worker again (pid {pid}), ready after {fault.end - fault.start:.1f} s"
        )

    async def _track_settling(self, fault: Fault) -> None:
        ids = {kind: {row[0] for row in rows} for kind, rows in fault.in_flight.items()}
        if not any(ids.values()):
            fault.settled_after = 0.0
            return
        while now() - fault.start < SETTLE_SECONDS + 60:
            with contextlib.suppress(psycopg.Error):
                open_ = await self.open_work()
                if not any(row[0] in ids[kind] for kind, rows in open_.items() for row in rows):
                    fault.settled_after = now() - fault.start
                    return
            await asyncio.sleep(0.5)

    def spawn(self, coro) -> None:
        self.background.append(asyncio.create_task(coro))

    # --- the run --------------------------------------------------------------------------------------

    async def drive(self) -> None:
        self.background: list[asyncio.Task] = []
        stopping, listeners_stop = asyncio.Event(), asyncio.Event()
        schedule = [
            ("redis_restart", self.fault_redis),
            ("postgres_restart", self.fault_postgres),
            ("worker_children_kill", self.fault_worker_children),
            ("worker_kill", self.fault_worker_whole),
        ]
        self.rng.shuffle(schedule)
        self.say("fault order: " + ", ".join(name for name, _ in schedule))
        slots = [asyncio.create_task(self.listener_slot(i + 1, listeners_stop)) for i in range(LISTENERS)]
        while len(self.segments) < LISTENERS:
            await asyncio.sleep(0.1)
        self.t0, self.t0_clock = now(), time.strftime("%H:%M:%S")
        load = [asyncio.create_task(self.transfer_client(i, stopping)) for i in range(CLIENTS)]
        load.append(asyncio.create_task(self.money_out(stopping)))
        await asyncio.sleep(WARMUP_SECONDS)
        for name, inject in schedule:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            fault = Fault(name)
            self.faults.append(fault)
            self.say(f"fault {len(self.faults)}: {name}")
            await inject(fault)
            self.say(f"fault {len(self.faults)}: {name} over ({'; '.join(fault.steps)})")
            await asyncio.sleep(AFTER_SECONDS)
        stopping.set()
        await asyncio.gather(*load)
        self.load_end = now()
        self.say("load stopped; waiting for the feed, the listeners and the work in flight")
        await self.settle_listeners()
        listeners_stop.set()
        await asyncio.gather(*slots)
        await self.settle_work()
        await asyncio.gather(*self.background, return_exceptions=True)
        await self.resolve_unknown_transfers()

    async def settle_listeners(self) -> None:
        last, since = await self.peer_seq(), now()
        while now() - since < 1.5:
            await asyncio.sleep(0.2)
            seq = await self.peer_seq()
            if seq != last:
                last, since = seq, now()
        self.final_positions = await asyncio.to_thread(self.peer_positions)
        final = self.final_positions[-1] if self.final_positions else {"key": None, "last": 0}

        def caught_up(segment: Segment) -> bool:
            received = segment.feed.received
            return received[-1] == final["key"] if received else segment.seq_lo >= final["last"]

        deadline = now() + 20
        while now() < deadline:
            if all(caught_up(s) for s in self.segments if s.closed is None and not s.feed._task.done()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # anything after the last one (a duplicate) would show now

    async def settle_work(self) -> None:
        deadline = now() + SETTLE_SECONDS
        while now() < deadline:
            with contextlib.suppress(psycopg.Error):
                if not any((await self.open_work()).values()):
                    return
            await asyncio.sleep(1.0)

    async def resolve_unknown_transfers(self) -> None:
        """Asks the service, as its client would, whether each transfer with an unknown outcome was
        made: GET .../transfers?client_transfer_id= signed by the sender (total_count 0 or 1)."""
        self.resolved: dict[str, int | None] = {}
        limit = asyncio.Semaphore(4)

        async def ask(answer: Answer) -> None:
            async with limit:
                signer = self.signers[answer.role]
                query = signer.signed({"client_transfer_id": answer.ident})
                conn = _load.HttpConnection(HOST, self.port)
                try:
                    status, body = await asyncio.wait_for(
                        conn.request("GET", f"{TRANSFER_QUERY}?{query}", {"X-SERVICE-APIKEY": signer.api_key}),
                        HUNG_SECONDS,
                    )
                    if status == 200:
                        self.resolved[answer.ident] = int(json.loads(body)["meta"]["total_count"])
                except Exception:  # noqa: BLE001 - unresolved: reported as such
                    self.resolved[answer.ident] = None
                finally:
                    await conn.close()

        await asyncio.gather(*[ask(a) for a in self.answers if a.kind == "transfer" and a.unknown])

    # --- the feed ---------------------------------------------------------------------------------------

    def peer_positions(self) -> list[dict]:
        return account_positions(self.book, self.ids["peer"])

    def judge_segment(self, segment: Segment) -> None:
        judge_segment(self.final_positions, segment)


# --- the feed, judged ---------------------------------------------------------------------------------


def account_positions(book: Book, account_id: int) -> list[dict]:
    """Each posting that touched the account, in sequence order: its first and last sequence and the
    outboundAccountPosition it must produce (u, and free/locked of each row)."""
    rows = book.rows(
        "SELECT c.seq, c.posting_id, a.code, c.free_after, c.locked_after, c.created_at"
        " FROM accounts_balancechange c JOIN accounts_asset a ON a.id = c.asset_id"
        " WHERE c.account_id = %s ORDER BY c.seq",
        [account_id],
    )
    positions: list[dict] = []
    for seq, posting, code, free, locked, created in rows:
        if positions and positions[-1]["posting"] == posting:
            group = positions[-1]
        else:
            group = {"posting": posting, "first": seq, "rows": []}
            positions.append(group)
        group["last"] = seq
        group["rows"].append((code, Decimal(free), Decimal(locked)))
        group["u"] = int(created.timestamp() * 1000)
    for group in positions:
        group["key"] = (group["u"], tuple(group["rows"]))
    return positions


def judge_segment(positions: list[dict], segment: Segment) -> None:
    """What one connection received against the feed: exactly the postings after its starting
    point (somewhere in [seq_lo, seq_hi]) up to the end, or, for one the server closed, a gapless
    run of them from that point."""
    keys = [p["key"] for p in positions]
    got = segment.feed.received
    first_after_lo = next((i for i, p in enumerate(positions) if p["first"] > segment.seq_lo), len(positions))
    first_after_hi = next((i for i, p in enumerate(positions) if p["first"] > segment.seq_hi), len(positions))
    final = segment.closed is None
    for start in range(first_after_lo, first_after_hi + 1):
        expected = keys[start:] if final else keys[start : start + len(got)]
        if got == expected:
            if not final:
                segment.verdict = f"{len(got)} positions, a gapless run of the feed until the close"
            elif got:
                segment.verdict = (
                    f"{len(got)} positions, exactly the {len(got)} postings since it connected, in order, "
                    "the last with the database's balance"
                )
            else:
                segment.verdict = "no posting touched the peer since it connected, and it received nothing"
            return
    index: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        index.setdefault(key, i)
    seen = [index.get(key) for key in got]
    unknown = sum(1 for i in seen if i is None)
    known = [i for i in seen if i is not None]
    duplicates = len(known) - len(set(known))
    disorder = sum(1 for a, b in itertools.pairwise(known) if b <= a)
    begin = min(first_after_hi, known[0]) if known else first_after_hi
    end = len(keys) if final else (max(known) + 1 if known else begin)
    missing = sorted(set(range(begin, end)) - set(known))
    segment.ok = False
    segment.verdict = (
        f"{len(got)} positions against {end - begin} postings: missing {len(missing)}"
        f"{' (seq ' + ', '.join(str(positions[i]['first']) for i in missing[:5]) + ')' if missing else ''}, "
        f"duplicates {duplicates}, out of order {disorder}, not in the feed {unknown}; "
        f"last received {'matches' if got and keys and got[-1] == keys[-1] else 'does NOT match'} the database"
    )


# --- checks -------------------------------------------------------------------------------------------


def check_transfers(chaos: Chaos) -> Check:
    sent = [a for a in chaos.answers if a.kind == "transfer"]
    rows = chaos.book.rows(
        "SELECT client_transfer_id, id FROM wallet_transfer WHERE client_transfer_id LIKE %s", [f"chaos{chaos.seed}-t%"]
    )
    in_db: dict[str, list[str]] = {}
    for ident, pk in rows:
        in_db.setdefault(ident, []).append(str(pk))
    bad: list[str] = []
    ok200 = [a for a in sent if a.status == 200]
    refused = [a for a in sent if a.status is not None and 400 <= a.status < 500]
    unknown = [a for a in sent if a.unknown]
    for a in ok200:
        if in_db.get(a.ident) != [a.ref]:
            bad.append(f"{a.ident} answered 200 (id {a.ref}) but the database has {in_db.get(a.ident)}")
    for a in refused:
        if a.ident in in_db:
            bad.append(f"{a.ident} refused {a.label} but the database has {in_db[a.ident]}")
    done = not_done = 0
    for a in unknown:
        count = len(in_db.get(a.ident, []))
        asked = chaos.resolved.get(a.ident)
        if asked is None:
            bad.append(f"{a.ident} ({a.label}): the query by client_transfer_id got no answer")
        elif asked != count or count > 1:
            bad.append(f"{a.ident} ({a.label}): the API finds {asked}, the database {count}")
        if count:
            done += 1
        else:
            not_done += 1
    sent_ids = {a.ident for a in sent}
    strays = [ident for ident in in_db if ident not in sent_ids]
    if strays:
        bad.append(f"transfers in the database that were never sent: {strays[:5]}")
    detail = (
        f"{len(sent)} sent: {len(ok200)} answered 200, each once in the database with the id answered; "
        f"{len(refused)} refused {tally(refused)}, none in the database; {len(unknown)} unknown outcomes "
        f"{tally(unknown)} resolved by client_transfer_id: {done} done, {not_done} not done (API and database agree)"
    )
    if bad:
        detail += (
            "\n      " + "\n      ".join(bad[:10]) + (f"\n      ... {len(bad) - 10} more" if len(bad) > 10 else "")
        )
    return Check("transfers", not bad, detail)


def check_withdrawals(chaos: Chaos) -> Check:
    sent = [a for a in chaos.answers if a.kind == "withdrawal"]
    rows = chaos.book.rows(
        "SELECT withdraw_order_id, id, stage, attempts FROM wallet_withdrawal WHERE withdraw_order_id LIKE %s",
        [f"cw{chaos.seed}-%"],
    )
    by_ident = {ident: (str(pk), stage, attempts) for ident, pk, stage, attempts in rows}
    references: dict[str, list[str]] = {}
    for (reference,) in chaos.book.rows("SELECT reference FROM accounts_posting WHERE reference LIKE 'withdrawal:%'"):
        references.setdefault(reference.split(":")[1], []).append(reference.split(":")[2])
    broadcasts = dict(
        chaos.book.rows(
            "SELECT client_reference, count(*) FROM wallet_simtransaction WHERE client_reference LIKE 'withdrawal:%'"
            " GROUP BY client_reference"
        )
    )
    bad: list[str] = []
    for a in sent:
        if a.status == 200 and (a.ident not in by_ident or by_ident[a.ident][0] != a.ref):
            bad.append(f"{a.ident} answered 200 (id {a.ref}) but the database has {by_ident.get(a.ident)}")
        if a.status is not None and 400 <= a.status < 500 and a.ident in by_ident:
            bad.append(f"{a.ident} refused {a.label} but exists: {by_ident[a.ident]}")
    stages = Counter(stage for _, stage, _ in by_ident.values())
    retried = sum(1 for _, _, attempts in by_ident.values() if attempts > 1)
    for ident, (pk, stage, _) in by_ident.items():
        legs = sorted(references.get(pk, []))
        want = {"SUCCEEDED": ["hold", "settle"], "FAILED": ["hold", "release"]}.get(stage)
        if want is None:
            bad.append(f"withdrawal {pk} ({ident}) still {stage}")
        elif legs != sorted(want):
            bad.append(f"withdrawal {pk} ({ident}) {stage} with postings {legs}")
        count = broadcasts.get(f"withdrawal:{pk}", 0)
        if count > 1 or (stage == "SUCCEEDED" and count != 1):
            bad.append(f"withdrawal {pk} ({ident}) {stage} broadcast {count} times")
    unknown = [a for a in sent if a.unknown]
    unknown_done = sum(1 for a in unknown if a.ident in by_ident)
    detail = (
        f"{len(sent)} applied: {sum(1 for a in sent if a.status == 200)} accepted, "
        f"{sum(1 for a in sent if a.status is not None and 400 <= a.status < 500)} refused, {len(unknown)} unknown "
        f"({unknown_done} done); in the database {len(by_ident)}: {dict(stages)}, {retried} run more than once; "
        "each with its hold and one settle (or release) posting, at most one broadcast"
    )
    if bad:
        detail += "\n      " + "\n      ".join(bad[:10])
    return Check("withdrawals", not bad, detail)


def check_collections(chaos: Chaos) -> Check:
    sent = [a for a in chaos.answers if a.kind == "collection"]
    moved = [a for a in chaos.answers if a.kind == "universal"]
    rows = chaos.book.rows(
        "SELECT client_request_id, id, status, attempts FROM subaccounts_fundcollection"
        " WHERE client_request_id LIKE %s",
        [f"chaos{chaos.seed}-c%"],
    )
    by_ident = {ident: (pk, status, attempts) for ident, pk, status, attempts in rows}
    subs = chaos.book.one("SELECT count(*) FROM accounts_user WHERE master_id = %s", [chaos.ids["master"]])[0]
    outcomes: dict[int, list[tuple]] = {}
    for collection, sub, status, posting in chaos.book.rows(
        "SELECT collection_id, sub_id, status, posting_id FROM subaccounts_fundcollectionoutcome"
    ):
        outcomes.setdefault(collection, []).append((sub, status, posting))
    postings: dict[int, list[str]] = {}
    for (reference,) in chaos.book.rows("SELECT reference FROM accounts_posting WHERE reference LIKE 'fund-collect:%'"):
        _, collection, sub = reference.split(":")
        postings.setdefault(int(collection), []).append(sub)
    bad: list[str] = []
    for a in sent:
        if a.status == 200 and a.ident not in by_ident:
            bad.append(f"{a.ident} answered 200 but is not in the database")
        if a.status is not None and 400 <= a.status < 500 and a.ident in by_ident:
            bad.append(f"{a.ident} refused {a.label} but exists")
    collected = 0
    for ident, (pk, status, _) in by_ident.items():
        if status not in FINAL_COLLECTION:
            bad.append(f"collection {pk} ({ident}) still {status}")
            continue
        mine = outcomes.get(pk, [])
        per_sub = Counter(sub for sub, _, _ in mine)
        if len(per_sub) != subs or max(per_sub.values(), default=0) > 1:
            bad.append(f"collection {pk} ({ident}) has outcomes {sorted(per_sub.items())} for {subs} sub-accounts")
        posted = Counter(postings.get(pk, []))
        want = Counter(str(sub) for sub, outcome, _ in mine if outcome == "COLLECTED")
        if posted != want:
            bad.append(f"collection {pk} ({ident}): postings {dict(posted)} against COLLECTED outcomes {dict(want)}")
        collected += sum(want.values())
    universal_rows = dict(
        chaos.book.rows(
            "SELECT client_tran_id, count(*) FROM subaccounts_subaccounttransfer WHERE client_tran_id LIKE %s"
            " GROUP BY client_tran_id",
            [f"chaos{chaos.seed}-u%"],
        )
    )
    for a in moved:
        count = universal_rows.get(a.ident, 0)
        if (a.status == 200 and count != 1) or (a.status is not None and 400 <= a.status < 500 and count) or count > 1:
            bad.append(f"universal transfer {a.ident} answered {a.label}, {count} in the database")
    statuses = Counter(status for _, status, _ in by_ident.values())
    detail = (
        f"{len(sent)} collect calls {tally(sent)}; in the database {len(by_ident)}: {dict(statuses)}, "
        f"{sum(1 for _, _, n in by_ident.values() if n > 1)} run more than once; {collected} sub-accounts collected, "
        f"one posting each; universal transfers {tally(moved)}, each 200 once in the database"
    )
    if bad:
        detail += "\n      " + "\n      ".join(bad[:10])
    return Check("collections", not bad, detail)


def check_websockets(chaos: Chaos) -> Check:
    for segment in chaos.segments:
        chaos.judge_segment(segment)
    final = [s for s in chaos.segments if s.closed is None]
    closed = [s for s in chaos.segments if s.closed is not None]
    lines = []
    for s in chaos.segments:
        life = f"{chaos.rel(s.opened)} .. {chaos.rel(s.closed) if s.closed else 'the end'}"
        why = f", closed by the server ({s.closed_with})" if s.closed else ""
        lines.append(f"slot {s.slot} {life}{why}: {'ok' if s.ok else 'BROKEN'}: {s.verdict}")
    detail = (
        f"{len(chaos.segments)} connections on {LISTENERS} slots: {len(final)} stayed to the end, "
        f"{len(closed)} closed by the server {dict(Counter(s.closed_with for s in closed))} and replaced; "
        f"listenKey requests {tally([a for a in chaos.answers if a.kind == 'listenkey'])}, handshakes refused "
        f"{dict(chaos.handshake_refusals) or 'none'}\n      " + "\n      ".join(lines)
    )
    return Check("websockets", all(s.ok for s in chaos.segments) and len(final) == LISTENERS, detail)


def check_ledger(chaos: Chaos) -> Check:
    done = manage(chaos.env, "ledger_check")
    text = (done.stdout + done.stderr).strip()
    return Check("ledger_check", done.returncode == 0, text.splitlines()[-1] if text else f"exit {done.returncode}")


def nginx_statuses(run_dir: Path) -> Counter:
    counts: Counter = Counter()
    log = run_dir / "access.log"
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split('"')
            if len(parts) > 2 and parts[2].split():
                counts[parts[2].split()[0]] += 1
    return counts


def stack_log_findings(path: Path) -> tuple[Counter, list[str], list[str]]:
    """What the stack's programs printed: counts of tracebacks and notable messages; each exit the
    Supervisor saw, with the program's last lines before it; the first tracebacks, those of
    unexpected errors (the -1000 answers) first (for a defect report)."""
    counts: Counter = Counter()
    exits: list[str] = []
    unexpected: list[str] = []
    others: list[str] = []
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for i, line in enumerate(lines):
        head, _, text = line.partition(" | ")
        program = head.split()[-1] if head.split() else ""
        for marker in ("Traceback", "Unexpected error", "Database unavailable", "Exception inside application"):
            if marker in text:
                counts[marker] += 1
        if program == "stack" and "exited with" in text:
            counts["program exited (Supervisor)"] += 1
            name = text.split()[0]
            before = [earlier for earlier in lines[max(0, i - 400) : i] if f" {name} " in earlier.split("|")[0]]
            last = [] if "exited with -9;" in text else before[-8:]  # -9: our SIGKILL
            exits.append("\n".join([line, *("      " + b for b in last)]))
        if "Unexpected error" in text and len(unexpected) < 2:
            unexpected.append("\n".join(lines[i : i + 40]))
        elif "Traceback" in text and len(others) < 2:
            others.append("\n".join(lines[max(0, i - 1) : i + 30]))
    return counts, exits, (unexpected or others)


# --- the report ---------------------------------------------------------------------------------------


def fault_report(chaos: Chaos, index: int, fault: Fault) -> None:
    following = chaos.faults[index + 1].start if index + 1 < len(chaos.faults) else chaos.load_end
    fault.until = following
    during = [a for a in chaos.answers if fault.start <= a.ended <= fault.end]
    after = [a for a in chaos.answers if fault.end < a.ended <= following]
    transfers_during = [a for a in during if a.kind == "transfer"]
    transfers_after = [a for a in after if a.kind == "transfer"]
    first_ok = min((a.ended for a in transfers_after if a.status == 200), default=None)
    recovery = first_ok - fault.end if first_ok is not None else None
    lines = fault.lines
    lines.append(f"[{index + 1}] {fault.name}: " + "; ".join(fault.steps))
    lines.append(
        f"    window {chaos.rel(fault.start)} .. {chaos.rel(fault.end)} ({fault.end - fault.start:.1f} s); "
        f"after it until {chaos.rel(following)}"
    )
    lines.append(f"    transfers during: {tally(transfers_during)}")
    lines.append(f"    transfers after:  {tally(transfers_after)}")
    lines.append(
        "    first 200 after the end: "
        + (f"{recovery:.2f} s" if recovery is not None else f"NONE within {following - fault.end:.0f} s")
    )
    for kind in ("withdrawal", "universal", "collection", "listenkey"):
        seen_during = [a for a in during if a.kind == kind]
        seen_after = [a for a in after if a.kind == kind]
        if seen_during or seen_after:
            lines.append(f"    {kind}s: during {tally(seen_during)}, after {tally(seen_after)}")
    if fault.in_flight:
        lines.append(
            f"    in flight at the kill: withdrawals {fault.in_flight.get('withdrawals')}, "
            f"collections {fault.in_flight.get('collections')}; all final "
            + (f"{fault.settled_after:.1f} s after the kill" if fault.settled_after is not None else "NEVER")
        )
        if fault.settled_after is None:
            fault.problems.append(f"{fault.name}: the work in flight at the kill never became final")
    closed = [s for s in chaos.segments if s.closed is not None and fault.start <= s.closed <= following]
    if closed:
        reopened = [
            min((t.opened for t in chaos.segments if t.slot == s.slot and t.opened > s.closed), default=None)
            for s in closed
        ]
        waits = [r - s.closed for r, s in zip(reopened, closed, strict=True) if r is not None]
        lines.append(
            f"    websockets closed by the server: {len(closed)} "
            f"{dict(Counter(s.closed_with for s in closed))} at {', '.join(chaos.rel(s.closed) for s in closed)}; "
            f"connected again after {', '.join(f'{w:.1f} s' for w in waits) or '-'}"
        )
    else:
        lines.append("    websockets: none closed by the server")
    breaking = [a for a in during + after if a.breaks_a_rule]
    if breaking:
        fault.problems.append(f"{fault.name}: {len(breaking)} answers breaking the rules {tally(breaking)}")
    if recovery is None:
        fault.problems.append(f"{fault.name}: no transfer succeeded after the fault")
    elif recovery > RECOVERY_SECONDS:
        fault.problems.append(f"{fault.name}: the first 200 came {recovery:.0f} s after the fault")
    lines.append("    broken rules: " + ("; ".join(fault.problems) if fault.problems else "none"))


def build_report(chaos: Chaos, checks: list[Check], problems: list[str], extra: list[str]) -> str:
    transfers = [a for a in chaos.answers if a.kind == "transfer"]
    span = max(chaos.load_end - chaos.t0, 1e-9)
    lines = [
        f"chaos: seed {chaos.seed}; faults in the order {', '.join(f.name for f in chaos.faults)}",
        f"stack: nginx {HOST}:{chaos.port} -> granian {chaos.layout.rest_workers} x {chaos.layout.rest_threads}, "
        f"Daphne x {len(chaos.layout.ws_ports)}, Celery worker ({chaos.layout.celery_concurrency}) and beat; private "
        f"PostgreSQL {chaos.pg.version} (port {chaos.pg.port}, max_connections {chaos.pg.max_connections}) and Redis "
        f"(port {chaos.redis.port}, appendonly yes)",
        f"load: {CLIENTS} transfer clients ({CLIENTS * CLIENT_RATE:.0f}/s offered), {LISTENERS} websockets on the "
        f"peer's listenKey, a withdrawal every second and a universal transfer + collection every 3 s, "
        f"for {span:.0f} s: {len(transfers)} transfers, "
        f"{sum(a.status == 200 for a in transfers) / span:.0f}/s answered 200",
        "",
    ]
    for fault in chaos.faults:
        lines.extend(fault.lines)
    lines.append("")
    lines.append("final checks:")
    for check in checks:
        lines.append(f"  {'ok    ' if check.ok else 'BROKEN'} {check.name}: {check.detail}")
    lines.extend(extra)
    lines.append("")
    if problems:
        lines.append("RESULT: BROKEN")
        lines.extend(f"  PROBLEM: {p}" for p in problems)
    else:
        lines.append("RESULT: ok, no rule broken")
    return "\n".join(lines)


def run(seed: int | None = None, *, out=None, keep: bool = False) -> ChaosResult:
    """Everything: services, stack, load, faults, checks. The report is printed to `out` (stdout)
    and returned with the result."""
    out = out or sys.stdout
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 10**6)
    base = Path(tempfile.mkdtemp(prefix="chaos-"))
    chaos = Chaos(seed, out)
    checks: list[Check] = []
    problems: list[str] = []
    extra: list[str] = []
    try:
        chaos.start(base)
        asyncio.run(chaos.drive())
        for index, fault in enumerate(chaos.faults):
            fault_report(chaos, index, fault)
            problems.extend(fault.problems)
        elsewhere = [
            a for a in chaos.answers if a.breaks_a_rule and not any(f.start <= a.ended <= f.until for f in chaos.faults)
        ]
        if elsewhere:
            problems.append(f"{len(elsewhere)} answers breaking the rules outside the faults {tally(elsewhere)}")
        checks = [
            check_ledger(chaos),
            check_transfers(chaos),
            check_withdrawals(chaos),
            check_collections(chaos),
            check_websockets(chaos),
        ]
        problems.extend(f"{c.name}: {c.detail.splitlines()[0]}" for c in checks if not c.ok)
        restarts = {name: n for name, n in chaos.supervisor.restarts.items() if n}
        by_themselves = {name: n - (name == "worker") for name, n in restarts.items() if n - (name == "worker")}
        extra.append(
            f"  supervisor restarts: {restarts or 'none'} (the worker once after its SIGKILL)"
            + (f"; NOTE: exited by themselves (the times below): {by_themselves}" if by_themselves else "")
        )
    except BaseException:
        out.write(f"chaos: the run itself failed; its files are in {base}\n")
        raise
    finally:
        chaos.stop()
    time.sleep(2.5)  # nginx flushes its buffered access log every 2 s (it has stopped by now)
    statuses = nginx_statuses(chaos.run_dir)
    five = {s: n for s, n in statuses.items() if s.startswith("5")}
    extra.append(f"  nginx access log: {sum(statuses.values())} requests, 5xx {five or 'none'}")
    if any(s != "503" for s in five):
        problems.append(f"nginx logged 5xx other than 503: {five}")
    counts, exits, blocks = stack_log_findings(chaos.run_dir / "stack.log")
    extra.append(f"  stack log (clock {chaos.t0_clock} = +0.0 s): {dict(counts) or 'nothing notable'}")
    extra.extend("    " + line for exit_ in exits for line in exit_.splitlines())
    if blocks and problems:
        extra.append("  first tracebacks in the stack log:")
        extra.extend("    " + line for block in blocks for line in [*block.splitlines(), "    ---"])
    report = build_report(chaos, checks, problems, extra)
    log_dir = None
    if problems or keep:
        log_dir = base
        for name in ("pg/data", "redis/appendonlydir"):
            shutil.rmtree(base / name, ignore_errors=True)
        report += f"\nlogs kept in {base} (stack/stack.log, stack/access.log, pg/postgres.log, redis/redis.log)"
    else:
        shutil.rmtree(base, ignore_errors=True)
    out.write("\n" + report + "\n")
    out.flush()
    return ChaosResult(
        seed,
        chaos.faults,
        checks,
        problems,
        report,
        chaos.answers,
        chaos.segments,
        dict(chaos.supervisor.restarts),
        log_dir,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="fault order and timing (default: random, printed)")
    parser.add_argument("--keep", action="store_true", help="keep the logs in the temporary directory")
    options = parser.parse_args()
    return 0 if run(options.seed, keep=options.keep).ok else 1


if __name__ == "__main__":
    sys.exit(main())
