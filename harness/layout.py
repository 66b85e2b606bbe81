"""One stack's shape: its ports, its process counts, the PostgreSQL connections each kind of process may
open, the bounds on what a client sends, and the environment every process gets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    bind: str = "127.0.0.1"  # STACK_BIND: REST's and Daphne's address (a lab app host's own, behind HAProxy)

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
            bind=env.get("STACK_BIND") or "127.0.0.1",
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


def stack_env(env: dict[str, str]) -> dict[str, str]:
    """The environment every process of the stack gets."""
    out = dict(env)
    out.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")
    out.setdefault("TRUSTED_PROXIES", "127.0.0.1")  # nginx, which overwrites X-Forwarded-For
    out.setdefault("EMBEDDED_SCHEDULER", "false")  # the beat runs the schedule
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out
