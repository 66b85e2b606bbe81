"""The full stack as production runs it, started by one command (`make run` with DATABASE_URL and
REDIS_URL set, or `python -m exchange.stack`), and by the benchmarks and the fault tests the same way:

    clients ──> nginx 127.0.0.1:$PORT ─┬─ /openapi/ws/ ─> Daphne (websocket), 127.0.0.1:$PORT+2...
                                       └─ everything else ─> granian WSGI (REST, admin, docs), 127.0.0.1:$PORT+1
    Celery worker (tasks) and Celery beat (the schedule), PostgreSQL, Redis.

- REST on granian's WSGI interface, one worker per core (`STACK_REST_WORKERS`), each with
  `STACK_REST_THREADS` blocking threads; the websocket on `STACK_WS_PROCESSES` Daphne processes
  (one port each, nginx spreads connections over them); one Celery worker
  (`STACK_CELERY_CONCURRENCY` processes) and one beat.
- Every web process has a bounded pool of PostgreSQL connections (DB_POOL_MAX_SIZE, set here per
  kind of process); a Celery process keeps one connection per thread (its task's and its
  publisher's); `connection_budget()` is the most the stack can open, printed at start and checked
  against the server's max_connections (docs/operations.md, "Database connections").
- nginx overwrites X-Forwarded-For with its peer's address and the backends trust 127.0.0.1
  (TRUSTED_PROXIES), so limits and API-key IP lists see the client's address; nginx's access log is
  buffered (var/stack/access.log), the backends' are off.
- A process that exits is started again (after a pause that grows while it keeps failing); SIGINT or
  SIGTERM stops everything (granian and Daphne finish the requests in flight).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent if (Path(sys.executable).parent / "granian").exists() else ROOT / ".venv" / "bin"

# Connections each kind of process may open (its pool's max_size). REST: one per blocking thread,
# one for the stream publisher's thread (it marks published rows), one spare for the relay's
# sweeper or a management call. Daphne: its sync thread (database_sync_to_async) and the watcher.
# Celery: per pool process, the task and the publisher of the postings it makes.
POOL_REST_EXTRA = 2
POOL_WS = 4
POOL_CELERY = 2
POOL_BEAT = 1

# What a client may send (docs/api.md, "Request size"): nginx's body bounds (the gateway's
# API_MAX_BODY_BYTES and Django's DATA_UPLOAD_MAX_MEMORY_SIZE, which refuse the same when nginx is not
# in front), the seconds nginx gives a client to send its headers, and between two reads of a body
# (STACK_CLIENT_TIMEOUT), and Daphne's bound on one websocket frame and one message from a client
# (above the application's STREAM_MAX_MESSAGE_CHARS, 100,000: a SUBSCRIBE of 1024 listenKeys).
MAX_API_BODY_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
CLIENT_TIMEOUT_SECONDS = 10
WS_MAX_MESSAGE_BYTES = 128 * 1024


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    return int(value) if value else default


@dataclass
class Layout:
    """Ports and process counts of one stack."""

    port: int
    rest_port: int
    ws_ports: list[int]
    rest_workers: int
    rest_threads: int
    celery_concurrency: int
    run_dir: Path
    beat: bool = True
    rest_app: str = "exchange.wsgi:application"  # STACK_REST_APP: a diagnostic wrapper (bench/_phases.py)
    client_timeout: int = CLIENT_TIMEOUT_SECONDS  # STACK_CLIENT_TIMEOUT

    @classmethod
    def from_env(cls, env: dict[str, str], port: int | None = None, run_dir: Path | None = None) -> Layout:
        port = port if port is not None else _int_env(env, "PORT", 8000)
        ws_processes = _int_env(env, "STACK_WS_PROCESSES", 1)
        rest_port = _int_env(env, "STACK_REST_PORT", port + 1)
        ws_first = _int_env(env, "STACK_WS_PORT", rest_port + 1)
        return cls(
            port=port,
            rest_port=rest_port,
            ws_ports=[ws_first + i for i in range(ws_processes)],
            rest_workers=_int_env(env, "STACK_REST_WORKERS", os.cpu_count() or 1),
            rest_threads=_int_env(env, "STACK_REST_THREADS", 6),
            celery_concurrency=_int_env(env, "STACK_CELERY_CONCURRENCY", 2),
            run_dir=run_dir or Path(env.get("STACK_RUN_DIR") or ROOT / "var" / "stack"),
            beat=env.get("STACK_BEAT", "true").lower() not in ("0", "false", "no", "off"),
            rest_app=env.get("STACK_REST_APP") or "exchange.wsgi:application",
            client_timeout=_int_env(env, "STACK_CLIENT_TIMEOUT", CLIENT_TIMEOUT_SECONDS),
        )

    @property
    def rest_pool(self) -> int:
        return self.rest_threads + POOL_REST_EXTRA

    def connection_budget(self) -> int:
        """The most PostgreSQL connections the stack opens at any load (the pools' sizes)."""
        return (
            self.rest_workers * self.rest_pool
            + len(self.ws_ports) * POOL_WS
            + self.celery_concurrency * POOL_CELERY
            + (POOL_BEAT if self.beat else 0)
        )


@dataclass
class Program:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the stack's environment
    port: int | None = None  # listening when started


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if found:
        return found
    sys.stderr.write("Installing nginx from Debian packages (the full stack's front)\n")
    as_root = [] if os.geteuid() == 0 else ["sudo"]
    quiet = {"stdout": subprocess.DEVNULL}
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*as_root, "apt-get", "update", "-qq"], check=True, **quiet)  # noqa: S603 - fixed arguments
    # policy-rc.d 101: the package's own nginx service is not started (it would take port 80).
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy and os.geteuid() == 0:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        install = [*as_root, "apt-get", "install", "-y", "-qq"]
        subprocess.run([*install, "nginx-light"], check=False, env=apt_env, **quiet)  # noqa: S603 - fixed arguments
        if not Path("/usr/sbin/nginx").exists():
            subprocess.run([*install, "nginx"], check=True, env=apt_env, **quiet)  # noqa: S603 - fixed arguments
    finally:
        if not had_policy and os.geteuid() == 0:
            policy.unlink(missing_ok=True)
    return "/usr/sbin/nginx"


# What nginx itself refuses, answered in the gateway's envelope (-1010, the spec's bad request), by status.
NGINX_REFUSALS = {
    400: "Malformed request: headers too large or not HTTP.",
    408: "Request not received in time.",
    413: "Request body too large.",
    414: "Request line too long.",
}


def _refusal_locations() -> str:
    """nginx's error pages for NGINX_REFUSALS (494: request header too large, answered as 400)."""
    lines = [f"        error_page {'400 494' if code == 400 else code} /_refused/{code};" for code in NGINX_REFUSALS]
    for status, msg in NGINX_REFUSALS.items():
        lines += [
            f"        location = /_refused/{status} {{",
            "            internal;",
            "            default_type application/json;",
            f"            return {status} '{json.dumps({'code': -1010, 'msg': msg}, separators=(',', ':'))}';",
            "        }",
        ]
    return "\n".join(lines)


# The REST locations' proxying (the admin's and the API's differ only in their body bound).
_REST_PROXY = """\
            proxy_pass http://rest;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_buffering off;
            proxy_read_timeout 60s;
            proxy_send_timeout 30s;"""


def nginx_conf(layout: Layout) -> str:
    run = layout.run_dir
    refusals = _refusal_locations()
    ws_servers = "\n".join(f"        server 127.0.0.1:{port};" for port in layout.ws_ports)
    return f"""# Written by exchange/stack.py at every start; edit that file, not this one.
worker_processes 1;
pid {run}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log {run}/access.log combined buffer=256k flush=2s;
    client_body_temp_path {run}/nginx-body;
    proxy_temp_path {run}/nginx-proxy;
    fastcgi_temp_path {run}/nginx-fastcgi;
    uwsgi_temp_path {run}/nginx-uwsgi;
    scgi_temp_path {run}/nginx-scgi;
    server_tokens off;
    # Bounds on what a client sends (docs/api.md, "Request size"): a request line over 8 KB gets 414,
    # a header line over 8 KB or headers over 32 KB 400, a body over 16 KB (/openapi/) or 64 KB (the
    # admin) 413; a client that takes longer than {layout.client_timeout} s to send its headers, or
    # between two reads of its body, is dropped: nginx reads the whole request before a backend sees
    # it, so a slow client never holds a REST thread. Every refusal is the JSON envelope
    # {{code: -1010, msg}} with nginx's 4XX status.
    large_client_header_buffers 4 8k;
    client_max_body_size {MAX_BODY_BYTES // 1024}k;
    client_body_buffer_size {MAX_BODY_BYTES // 1024}k;  # a body never goes to a temporary file
    client_body_timeout {layout.client_timeout}s;
    client_header_timeout {layout.client_timeout}s;
    send_timeout 30s;
    proxy_connect_timeout 5s;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    upstream rest {{
        server 127.0.0.1:{layout.rest_port};
        keepalive 128;
    }}
    upstream ws {{
        least_conn;
{ws_servers}
    }}
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        '' close;
    }}
    server {{
        listen 127.0.0.1:{layout.port} reuseport backlog=4096;
        # (URIs, not named locations: a request line too long to parse has no URI to redirect from.)
{refusals}
        # (proxy_set_header is not inherited by a location that sets any: each sets all of its own.)
        location /openapi/ws/ {{
            proxy_pass http://ws;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_buffering off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }}
        location / {{
{_REST_PROXY}
        }}
        location /openapi/ {{
            client_max_body_size {MAX_API_BODY_BYTES // 1024}k;
{_REST_PROXY}
        }}
    }}
}}
"""


def programs(layout: Layout, *, nginx: str | None = None) -> list[Program]:
    """What the stack runs, in start order (the front last: it answers 502 until a backend listens)."""
    bin_ = VENV_BIN
    run = layout.run_dir
    rest = Program(
        "rest",
        [
            str(bin_ / "granian"),
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(layout.rest_port),
            "--workers",
            str(layout.rest_workers),
            "--blocking-threads",
            str(layout.rest_threads),
            "--blocking-threads-idle-timeout",
            "300",
            "--backlog",
            "2048",
            "--respawn-failed-workers",
            "--workers-kill-timeout",
            "30",
            "--log-level",
            "warning",
            "--no-access-log",
            layout.rest_app,
        ],
        {"DB_POOL_MAX_SIZE": str(layout.rest_pool)},
        layout.rest_port,
    )
    ws = [
        Program(
            f"ws{i + 1}" if len(layout.ws_ports) > 1 else "ws",
            [
                str(bin_ / "daphne"),
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "--ping-interval",
                "20",
                "--ping-timeout",
                "30",
                # A storm of handshakes (300 at once) can take the hub longer than Daphne's 5 s default
                # to accept; past it Daphne drops the socket without an HTTP answer.
                "--websocket_connect_timeout",
                "30",
                "--websocket-max-frame-size",
                str(WS_MAX_MESSAGE_BYTES),
                "--websocket-max-message-size",
                str(WS_MAX_MESSAGE_BYTES),
                "--no-server-name",
                "exchange.asgi:application",
            ],
            {"DB_POOL_MAX_SIZE": str(POOL_WS)},
            port,
        )
        for i, port in enumerate(layout.ws_ports)
    ]
    worker = Program(
        "worker",
        [
            str(bin_ / "celery"),
            "-A",
            "exchange",
            "worker",
            "--loglevel",
            "warning",
            "--concurrency",
            str(layout.celery_concurrency),
            "--without-gossip",
            "--without-mingle",
        ],
        # No pool in the worker: Celery's Django fix-up closes the pool around every task in a prefork
        # child (celery/fixups/django.py, close_pool), which would reconnect per task and pull the pool
        # from under the relay's publisher thread. One connection per thread kept instead: the task's
        # and the publisher's, POOL_CELERY per pool process.
        {"DB_POOL": "false"},
    )
    beat = Program(
        "beat",
        [str(bin_ / "celery"), "-A", "exchange", "beat", "--loglevel", "warning", "--schedule", str(run / "beat")],
        {"DB_POOL": "false"},
    )
    front = Program(
        "nginx",
        [nginx or nginx_binary(), "-e", "stderr", "-c", str(run / "nginx.conf"), "-g", "daemon off;"],
        port=layout.port,
    )
    return [rest, *ws, worker, *([beat] if layout.beat else []), front]


def stack_env(env: dict[str, str]) -> dict[str, str]:
    """The environment every process of the stack gets."""
    out = dict(env)
    out.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")
    out.setdefault("TRUSTED_PROXIES", "127.0.0.1")  # nginx, which overwrites X-Forwarded-For
    out.setdefault("EMBEDDED_SCHEDULER", "false")  # the beat runs the schedule
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def wait_for_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port} after {timeout:.0f} s")


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def database_max_connections(env: dict[str, str]) -> int | None:
    """PostgreSQL's max_connections less the slots reserved for superusers; None if unknown."""
    url = env.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return None
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=5) as conn:
            total = int(conn.execute("SHOW max_connections").fetchone()[0])
            reserved = int(conn.execute("SHOW superuser_reserved_connections").fetchone()[0])
    except (psycopg.Error, OSError, ValueError):
        return None
    return total - reserved


try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    """In a program's process, between fork and exec: SIGTERM it when the supervisor dies, however
    it dies (SIGKILL included), so that no program outlives it holding its port (Linux only). Only
    a C call here: nothing that could wait for a lock another thread held at the fork."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    """Starts the programs, prefixes their output with their names, starts again one that exits,
    and stops them all on request."""

    RESTART_PAUSE_MAX = 30.0

    def __init__(self, programs: list[Program], env: dict[str, str], *, out=None, cwd: Path = ROOT) -> None:
        self.programs = programs
        self.env = env
        self.out = out or sys.stdout
        self.cwd = cwd
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, int] = {p.name: 0 for p in programs}
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._width = max(len(p.name) for p in programs)

    def _pump(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self._width}} | {line}\n")
                self.out.flush()

    def _spawn(self, program: Program) -> subprocess.Popen:
        proc = subprocess.Popen(  # noqa: S603 - our own programs (programs())
            program.args,
            cwd=self.cwd,
            env={**self.env, **program.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a signal to the supervisor's terminal group reaches us only
            preexec_fn=_die_with_parent,
        )
        threading.Thread(target=self._pump, args=(program.name, proc.stdout), daemon=True).start()
        self.procs[program.name] = proc
        return proc

    def start(self) -> None:
        for program in self.programs:
            proc = self._spawn(program)
            if program.port is not None:
                wait_for_port(program.port, proc=proc)

    def watch(self) -> None:
        """Until stop(): start again whatever exits (1 s pause, doubling while it keeps failing)."""
        pause = {p.name: 1.0 for p in self.programs}
        started = {p.name: time.monotonic() for p in self.programs}
        while not self.stopping.wait(0.5):
            for program in self.programs:
                proc = self.procs.get(program.name)
                if proc is None or proc.poll() is None:
                    continue
                self._say(
                    f"{program.name} exited with {proc.returncode}; starting it again in {pause[program.name]:.0f} s"
                )
                if self.stopping.wait(pause[program.name]):
                    return
                if time.monotonic() - started[program.name] > 60:
                    pause[program.name] = 1.0
                else:
                    pause[program.name] = min(self.RESTART_PAUSE_MAX, pause[program.name] * 2)
                started[program.name] = time.monotonic()
                self.restarts[program.name] += 1
                self._spawn(program)

    def _say(self, text: str) -> None:
        with self._lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {'stack':<{self._width}} | {text}\n")
            self.out.flush()

    def stop(self, timeout: float = 20.0) -> None:
        self.stopping.set()
        # The front first (no new requests), then the rest; each finishes what it is doing.
        for program in reversed(self.programs):
            proc = self.procs.get(program.name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGQUIT if program.name == "nginx" else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def pid(self, name: str) -> int:
        return self.procs[name].pid


def prepare(env: dict[str, str], layout: Layout) -> list[Program]:
    """Check the ports and the database's room, write nginx's configuration; the programs to run."""
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    busy = [p for p in [layout.port, layout.rest_port, *layout.ws_ports] if not port_free(p)]
    if busy:
        raise SystemExit(f"Port(s) {', '.join(map(str, busy))} already in use: set PORT (and STACK_*_PORT).")
    room = database_max_connections(env)
    budget = layout.connection_budget()
    if room is not None and budget > room:
        raise SystemExit(
            f"The stack may open {budget} PostgreSQL connections but the server allows {room} "
            "(max_connections less the superuser reserve): lower STACK_REST_THREADS/WORKERS or raise max_connections."
        )
    (layout.run_dir / "nginx.conf").write_text(nginx_conf(layout))
    return programs(layout)


def banner(layout: Layout, room: int | None) -> str:
    ws = ", ".join(str(p) for p in layout.ws_ports)
    return (
        f"Full stack on 127.0.0.1:{layout.port} (nginx)\n"
        f"  REST       http://127.0.0.1:{layout.port}/openapi/...   (granian WSGI, {layout.rest_workers} workers x "
        f"{layout.rest_threads} threads, port {layout.rest_port})\n"
        f"  websocket  ws://127.0.0.1:{layout.port}/openapi/ws/<listenKey>   "
        f"(Daphne x {len(layout.ws_ports)}, port {ws})\n"
        f"  admin      http://127.0.0.1:{layout.port}/admin/   API docs http://127.0.0.1:{layout.port}/openapi/docs\n"
        f"  Celery worker (concurrency {layout.celery_concurrency}){' and beat' if layout.beat else ''}\n"
        f"  PostgreSQL connections: at most {layout.connection_budget()}"
        + (f" of the server's {room}" if room is not None else "")
    )


def main() -> int:
    env = stack_env(dict(os.environ))
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        raise SystemExit("The full stack needs DATABASE_URL (PostgreSQL) and REDIS_URL.")
    layout = Layout.from_env(env)
    progs = prepare(env, layout)
    supervisor = Supervisor(progs, env)

    def on_signal(signum, frame):
        supervisor.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        supervisor.start()
        sys.stdout.write(banner(layout, database_max_connections(env)) + "\n")
        sys.stdout.flush()
        supervisor.watch()
    finally:
        supervisor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
