"""Another real process of the service for the cross-process cache tests (tests/convert/
test_reference_cache.py, tests/wallet/test_transfer_reference_cache.py): a worker module run as
`python -m <module> <args>` from the project root, on the test's own database and Redis, with
REFERENCE_CACHE_SECONDS at 60 so that only the invalidation can deliver a change within the bound.
The worker answers its commands with `serve` (below), one line each on stdout:

- `warm`: `warm <what its warm-up says>`;
- `watch <seconds>`: it works in a loop until it sees a change, answered `<what it saw>
  <time.time() of the start of the work that saw it> <detail>`, or the seconds pass: `unchanged
  <pieces of work done>`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
# Why a test with another process cannot run on SQLite (not a PostgreSQL-only skip of
# tests/support/skips.py: these modules are not in the SQLite run).
NEEDS_POSTGRESQL = "another process needs the shared database"


class OtherProcess:
    def __init__(self, module: str, *args: str, env: dict[str, str] | None = None) -> None:
        db = connection.settings_dict
        self.proc = subprocess.Popen(  # noqa: S603 - this interpreter and a module of the tests
            [sys.executable, "-m", module, *args],
            cwd=ROOT,  # from the project root: the project's packages import
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "exchange.settings.test",
                "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
                "REDIS_URL": settings.REDIS_URL,
                "REFERENCE_CACHE_SECONDS": "60",
                **(env or {}),
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> list[str]:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def watch(self, change: Callable[[], object], seconds: float = 5.0) -> tuple[list[str], float]:
        """Let the other process work in a loop, make `change` here meanwhile; its answer and the
        moment the change committed (time.time())."""
        self.proc.stdin.write(f"watch {seconds}\n")
        self.proc.stdin.flush()
        time.sleep(0.3)  # it works from its warm caches meanwhile
        change()
        committed = time.time()  # autocommit: the change and its after-commit step are done
        return self._answer(), committed

    def _answer(self) -> list[str]:
        line = self.proc.stdout.readline()
        assert line, f"the other process exited ({self.proc.poll()})"
        return line.rstrip("\n").split(maxsplit=2)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def serve(*, warm: Callable[[], object], look: Callable[[], tuple[str, str] | None]) -> int:
    """The worker's side: answer the commands on stdin until it closes. `warm()` warms the worker's
    caches; `look()` does one piece of work and says what changed, (what, detail), or None."""
    for line in sys.stdin:
        command, *args = line.split()
        if command == "warm":
            answer = f"warm {warm()}"
        elif command == "watch":
            answer = _watch(float(args[0]), look)
        else:
            answer = f"unknown {command}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    return 0


def _watch(seconds: float, look: Callable[[], tuple[str, str] | None]) -> str:
    deadline, made = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        started = time.time()
        seen = look()
        if seen is not None:
            return f"{seen[0]} {started!r} {seen[1]}"
        made += 1
        time.sleep(0.005)
    return f"unchanged {made}"


def seconds_after(answer: list[str], committed: float, what: str, capsys) -> float:
    """How long after the commit the other process saw the change (printed with the test's output)."""
    seconds = float(answer[1]) - committed
    with capsys.disabled():
        sys.stdout.write(f"\n  {what}: another process saw it {seconds * 1000:.0f} ms after the commit\n")
    return seconds
