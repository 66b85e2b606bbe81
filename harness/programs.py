"""What the stack runs: the command line and environment of each program, in start order."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.layout import POOL_WS, VENV_BIN, WS_MAX_MESSAGE_BYTES, Layout
from harness.nginx import nginx_binary


@dataclass
class Program:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the stack's environment
    port: int | None = None  # listening when started


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
            layout.bind,
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
                layout.bind,
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
