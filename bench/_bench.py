"""What the benchmarks share beyond the harness (harness): their environment on the shared
servers, the REST server to measure on its own (granian, or gunicorn for comparisons), and wrk.

Every bench is a module run from the project root, `.venv/bin/python -m bench.NAME`: it starts and
stops what it needs, prints `name: value` lines and ends with `headline: VALUE`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from harness import services
from harness.layout import VENV_BIN
from harness.ports import wait_for_port
from harness.services import flush_redis, services_env

PYTHON = sys.executable


def manage(env: dict[str, str], *args: str) -> str:
    """`manage.py ARGS`'s output (a failure raises with its output)."""
    return services.manage(env, *args).stdout


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
    """env's database dropped, created and migrated; its Redis database emptied."""
    server, _, name = env["DATABASE_URL"].rpartition("/")
    services.recreate_database(server, name)
    flush_redis(env["REDIS_URL"])
    manage(env, "migrate", "--noinput", "-v", "0")


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
    """`args` as a process group that is always stopped (harness/services.py), listening on
    `port` when given."""
    with services.process(args, env, Path(args[0]).name) as proc:
        if port is not None:
            wait_for_port(port, 30, proc=proc.proc, log=str(proc.log))
        yield proc.proc


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


def run_wrk(
    port: int,
    lua: Callable[[Path], str],
    lines: list[str],
    *,
    seconds: float,
    connections: int,
    threads: int = 1,
    timeout: str | None = None,
) -> str:
    """wrk's output for `seconds` against 127.0.0.1:`port`: its Lua script is `lua(file)`, where the
    file holds `lines` (one request each, as the script reads them); wrk's stderr is shown."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "requests.txt"
        data.write_text("\n".join(lines) + "\n")
        script = Path(tmp) / "bench.lua"
        script.write_text(lua(data))
        done = subprocess.run(
            [
                ensure_wrk(),
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds}s",
                "--latency",
                *(["--timeout", timeout] if timeout else []),
                "-s",
                str(script),
                f"http://127.0.0.1:{port}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    if done.stderr.strip():
        sys.stderr.write(done.stderr[-2000:])
    return done.stdout


def wrk_rps(out: str) -> float:
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def wrk_latency(out: str) -> dict[str, float]:
    """wrk's p50 and p99 latency in milliseconds (`--latency`)."""
    return {
        "p50_ms": _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1)),
        "p99_ms": _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1)),
    }


def socket_errors(out: str) -> int:
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return sum(int(n) for n in errors.groups()) if errors else 0


def wrk(
    port: int, paths: list[str], *, api_key: str = "", seconds: int = 10, connections: int = 16, threads: int = 1
) -> dict[str, float]:
    """Requests per second (and latency) of GETs cycling through `paths`; non-200s are counted."""
    lua = lambda data: _WRK_LUA % (data, api_key)  # noqa: E731 - the script around the paths' file
    out = run_wrk(port, lua, paths, seconds=seconds, connections=connections, threads=threads)
    return {"rps": wrk_rps(out), "non200": non2xx(out), **wrk_latency(out)}


def non2xx(wrk_output: str) -> int:
    """wrk's own count of non-2xx/3xx responses (a Lua counter would live in one thread's state
    and never reach `done`). Absent from the output when there were none."""
    found = re.search(r"Non-2xx or 3xx responses: (\d+)", wrk_output)
    return int(found.group(1)) if found else 0


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]
