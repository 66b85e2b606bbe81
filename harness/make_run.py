"""`make run` itself, as a user starts it, in a subprocess: with DATABASE_URL and REDIS_URL set it
migrates, collects the static files, loads the demo world and starts the full stack
(harness/run.py); the benches measure that stack."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from harness.layout import ROOT, Layout
from harness.ports import free_block, port_free
from harness.programs import programs
from harness.services import fresh_database


class Running(NamedTuple):
    pid: int  # `make run` (its process tree is the whole stack)
    port: int  # nginx: REST and websocket
    log: Path  # what `make run` printed
    run_dir: Path  # the stack's files (nginx.conf, supervisord.conf, access.log)
    env: dict[str, str]


@contextlib.contextmanager
def make_run(env: dict[str, str], port: int | None = None, timeout: float = 300):
    """`make run PORT=port` with env's DATABASE_URL and REDIS_URL, on a fresh database and Redis
    database; stopped (SIGTERM to its process group, as Ctrl-C) at the end, and its ports free again."""
    port = port or free_block()
    run_dir = Path(tempfile.mkdtemp(prefix="stack-run-"))
    env = {**env, "PORT": str(port), "STACK_RUN_DIR": str(run_dir)}
    fresh_database(env)
    log = run_dir / "make-run.log"
    # Append mode: supervisord and its log listener write to the same file (harness/supervisor.py).
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - make run, as a user runs it
            ["make", "--no-print-directory", "run", f"PORT={port}"],  # noqa: S607
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
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.time() + 40
        ports = [layout.port, layout.rest_port, *layout.ws_ports]
        while time.time() < deadline and not all(port_free(p) for p in ports):
            time.sleep(0.2)


def stack_label(running: Running) -> str:
    """What the benches print on their `server:` line for the stack `make_run` started."""
    layout = Layout.from_env(running.env, port=running.port, run_dir=running.run_dir)
    return (
        f"make run (harness): nginx, granian WSGI {layout.rest_workers} workers x "
        f"{layout.rest_threads} threads, Daphne, Celery worker and beat, PostgreSQL, Redis"
    )


def stack_command(name: str, **options: str) -> list[str]:
    """The command line `make run` starts for the full stack's program `name` ("worker", "beat",
    "rest", "ws"), with the values of the given `--option`s replaced (e.g. schedule=<a file> for beat)."""
    layout = Layout.from_env({}, port=8000, run_dir=Path(tempfile.gettempdir()))
    for program in programs(layout, nginx="nginx"):
        if program.name == name:
            args = list(program.args)
            break
    else:
        raise RuntimeError(f"no program {name!r} in harness/programs.py")
    for option, value in options.items():
        args[args.index(f"--{option}") + 1] = value
    return args
