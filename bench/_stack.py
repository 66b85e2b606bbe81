"""Shared plumbing for the benchmarks: services, a throwaway database, a server, wrk.

Every bench/NAME script: runnable from the project root after `make test` installed the services,
starts and stops what it needs, prints `name: value` lines and ends with `headline: VALUE`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = str(VENV_BIN / "python")


def services_env() -> dict[str, str]:
    out = subprocess.run([str(ROOT / "scripts" / "services.sh")], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.strip().splitlines() if "=" in line)


def bench_env(db_name: str, redis_db: int, **extra: str) -> dict[str, str]:
    """Environment for a server on a fresh database `db_name` and Redis database `redis_db`."""
    urls = services_env()
    base_db = urls["DATABASE_URL"].rsplit("/", 1)[0]
    redis_base = urls["REDIS_URL"].rsplit("/", 1)[0]
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="exchange.settings.base",
        DATABASE_URL=f"{base_db}/{db_name}",
        REDIS_URL=f"{redis_base}/{redis_db}",
        DEBUG="false",
        LOG_LEVEL="WARNING",
        **extra,
    )
    return env


def recreate_database(env: dict[str, str]) -> None:
    url = env["DATABASE_URL"]
    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    code = (
        "import psycopg,sys\n"
        f"c=psycopg.connect({admin_url!r}, autocommit=True)\n"
        f"c.execute('DROP DATABASE IF EXISTS {name} WITH (FORCE)')\n"
        f"c.execute('CREATE DATABASE {name}')\n"
    )
    subprocess.run([PYTHON, "-c", code], check=True)
    subprocess.run(
        # Emptied, the store has seen no signature: its replay memory is complete (exchange/api/ratelimit/replay.py).
        [
            PYTHON,
            "-c",
            "import redis,os; from exchange.api.replay_memory import declare_complete; "
            "r=redis.from_url(os.environ['REDIS_URL']); r.flushdb(); declare_complete(r)",
        ],
        check=True,
        env=env,
    )
    manage(env, "migrate", "--noinput", "-v", "0")


def manage(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


class RestServer(NamedTuple):
    args: list[str]  # the command line
    label: str  # what the benches print on their `server:` line


# granian's idle blocking threads exit after this many seconds (its default is 30); each one that exits
# leaves its PostgreSQL connection open until the garbage collector frees it, and its replacement
# connects (and prepares the ledger's statements) anew. The production value (docs/operations.md).
GRANIAN_IDLE_THREAD_SECONDS = 300


def rest_server(
    port: int, *, workers: int, threads: int, gunicorn_preload: bool = False, app: str = "exchange.wsgi:application"
) -> RestServer:
    """The REST server as production runs it (docs/operations.md): granian's WSGI interface with
    `workers` processes of `threads` blocking threads each, on 127.0.0.1:`port`, serving `app` (the
    production application unless a diagnostic wraps it, e.g. bench/_phases.py).

    BENCH_SERVER=gunicorn selects gunicorn with BENCH_WORKER_CLASS (default gthread) workers of
    `threads` threads instead, for comparisons; `gunicorn_preload` sets up Django before it forks.
    """
    server = os.environ.get("BENCH_SERVER", "granian")
    if server == "granian":
        args = [
            str(VENV_BIN / "granian"),
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--blocking-threads",
            str(threads),
            "--blocking-threads-idle-timeout",
            str(GRANIAN_IDLE_THREAD_SECONDS),
            "--log-level",
            "warning",
            "--no-access-log",
            app,
        ]
        return RestServer(args, f"granian (WSGI) {workers} workers x {threads} blocking threads")
    if server == "gunicorn":
        worker_class = os.environ.get("BENCH_WORKER_CLASS", "gthread")
        args = [
            str(VENV_BIN / "gunicorn"),
            app,
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            worker_class,
            "--threads",
            str(threads),
            "--keep-alive",
            "5",
            "--log-level",
            "warning",
        ]
        if gunicorn_preload:
            args.append("--preload")
        return RestServer(args, f"gunicorn {worker_class} {workers} workers x {threads} threads")
    raise SystemExit(f"BENCH_SERVER={server!r}: granian (default) or gunicorn")


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], port: int | None = None):
    log = tempfile.NamedTemporaryFile(prefix="bench-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if port is not None:
            wait_for_port(port)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        if proc.returncode not in (0, -signal.SIGTERM, None) and proc.returncode != 143:
            sys.stderr.write(Path(log.name).read_text()[-3000:])
        os.unlink(log.name)


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "wrk"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        stdout=subprocess.DEVNULL,
    )
    return shutil.which("wrk") or "wrk"


_WRK_LUA = """
local paths = {}
for line in io.lines("%s") do paths[#paths + 1] = line end
local i = 0
local key = "%s"
request = function()
  i = i %% #paths + 1
  return wrk.format("GET", paths[i], key ~= "" and {["X-SERVICE-APIKEY"] = key} or nil)
end
local non2xx = 0
response = function(status, headers, body)
  if status ~= 200 then non2xx = non2xx + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("non200 %%d\\n", non2xx))
end
"""


def wrk(
    port: int, paths: list[str], *, api_key: str = "", seconds: int = 10, connections: int = 16, threads: int = 1
) -> dict[str, float]:
    """Requests per second (and latency) of GETs cycling through `paths`; non-200s are counted."""
    with tempfile.TemporaryDirectory() as tmp:
        paths_file = Path(tmp) / "paths.txt"
        paths_file.write_text("\n".join(paths) + "\n")
        script = Path(tmp) / "bench.lua"
        script.write_text(_WRK_LUA % (paths_file, api_key))
        out = subprocess.run(
            [
                ensure_wrk(),
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds}s",
                "--latency",
                "-s",
                str(script),
                f"http://127.0.0.1:{port}",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non200 = non2xx(out)
    p50 = _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1))
    p99 = _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))
    return {"rps": rps, "non200": non200, "p50_ms": p50, "p99_ms": p99}


def non2xx(wrk_output: str) -> int:
    """wrk's own count of non-2xx/3xx responses (a Lua counter would live in one thread's state
    and never reach `done`). Absent from the output when there were none."""
    found = re.search(r"Non-2xx or 3xx responses: (\d+)", wrk_output)
    return int(found.group(1)) if found else 0


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def load_bench(name: str):
    """Another bench/NAME script as a module, to reuse its parts (its main() does not run)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(f"bench_{name}", str(ROOT / "bench" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def stack_module():
    """exchange/stack.py, what `make run` runs for the full stack."""
    sys.path.insert(0, str(ROOT))
    import exchange.stack

    return exchange.stack


def stack_command(name: str, **options: str) -> list[str]:
    """The command line `make run` starts for the full stack's program `name` (exchange/stack.py:
    "worker", "beat", "rest", "ws"), with the values of the given `--option`s replaced (e.g.
    schedule=<a temporary file> for beat)."""
    sys.path.insert(0, str(ROOT))
    from exchange.stack import Layout, programs

    layout = Layout.from_env({}, port=8000, run_dir=Path(tempfile.gettempdir()))
    for program in programs(layout, nginx="nginx"):
        if program.name == name:
            args = list(program.args)
            break
    else:
        raise RuntimeError(f"no program {name!r} in exchange/stack.py")
    for option, value in options.items():
        args[args.index(f"--{option}") + 1] = value
    return args


class Running(NamedTuple):
    pid: int  # `make run` (its process tree is the whole stack)
    port: int  # nginx: REST and websocket
    log: Path  # what `make run` printed
    run_dir: Path  # the stack's files (nginx.conf, access.log)
    env: dict[str, str]


def fresh_database(env: dict[str, str]) -> None:
    """Drop and create the database of env's DATABASE_URL and empty its Redis database (no migrate)."""
    url = env["DATABASE_URL"]
    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    import psycopg
    import redis

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    from exchange.api.replay_memory import declare_complete

    client = redis.from_url(env["REDIS_URL"])
    client.flushdb()
    declare_complete(client)


@contextlib.contextmanager
def make_run(env: dict[str, str], port: int | None = None, timeout: float = 300):
    """The stack exactly as a user starts it: `make run PORT=port` with DATABASE_URL and REDIS_URL
    set (migrate, collectstatic, the demo world, then exchange/stack.py: nginx, granian, Daphne,
    Celery worker and beat), on a fresh database; stopped (SIGTERM, as Ctrl-C) at the end."""
    sys.path.insert(0, str(ROOT))
    from exchange.stack import Layout

    port = port or _free_block()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-stack-"))
    env = {**env, "PORT": str(port), "STACK_RUN_DIR": str(run_dir)}
    fresh_database(env)
    log = run_dir / "make-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"PORT={port}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    layout = Layout.from_env(env, port=port, run_dir=run_dir)
    try:
        deadline = time.time() + timeout
        while "Full stack on" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"make run did not start the stack:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield Running(proc.pid, port, log, run_dir, env)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        # The supervisor stops its programs (own sessions) before it exits; wait for the ports.
        deadline = time.time() + 40
        ports = [layout.port, layout.rest_port, *layout.ws_ports]
        while time.time() < deadline and not all(_port_free(p) for p in ports):
            time.sleep(0.2)


def stack_label(running: Running) -> str:
    """What the benches print on their `server:` line for the stack `make_run` started."""
    from exchange.stack import Layout

    layout = Layout.from_env(running.env, port=running.port, run_dir=running.run_dir)
    return (
        f"make run (exchange/stack.py): nginx, granian WSGI {layout.rest_workers} workers x "
        f"{layout.rest_threads} threads, Daphne, Celery worker and beat, PostgreSQL, Redis"
    )


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_block(size: int = 4) -> int:
    """A port whose next `size - 1` are free too (nginx, REST, websocket)."""
    for _ in range(200):
        port = free_port()
        if port + size < 65535 and all(_port_free(port + i) for i in range(size)):
            return port
    raise RuntimeError("no block of free ports")


def demo_keys(env: dict[str, str]) -> dict:
    """The demo world's accounts and keys (`manage.py demo --json`; idempotent)."""
    import json

    return json.loads(manage(env, "demo", "--json"))
