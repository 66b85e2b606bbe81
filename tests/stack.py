"""Plumbing shared by the tests that start real processes (tests/streams/test_full_stack.py,
tests/wallet/test_worker_crash.py): are the services up, a free port, manage.py in a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def services_unreachable(pg_server: str, redis_url: str) -> str | None:
    """Why PostgreSQL (`pg_server`, a URL without database) or Redis cannot be reached, or None."""
    try:
        import psycopg
        import redis

        psycopg.connect(f"{pg_server}/postgres", connect_timeout=3).close()
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return f"PostgreSQL/Redis not reachable: {exc}"
    return None


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
    declared complete (exchange/api/ratelimit.py), so the first signed writes are not refused."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.set("LIMITS:exchange/replay-memory-epoch", 0)
