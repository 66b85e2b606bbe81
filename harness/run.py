"""`make run`'s full stack (`python -m harness`): check the ports and the database's room,
write the configurations, start supervisord, print what runs where once everything listens, and stop
it all on SIGINT or SIGTERM."""

from __future__ import annotations

import os
import signal
import sys

from harness.layout import Layout, stack_env
from harness.nginx import nginx_conf
from harness.ports import port_free
from harness.programs import Program, programs
from harness.supervisor import Supervisor


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


def prepare(env: dict[str, str], layout: Layout) -> list[Program]:
    """Check the ports and the database's room, write nginx's configuration; the programs to run
    (supervisor.Supervisor writes supervisord's)."""
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
    supervisor = Supervisor(prepare(env, layout), env, layout.run_dir)

    def on_signal(signum, frame):
        # Ctrl-C reaches supervisord too (the terminal's process group); a SIGTERM to this process only.
        supervisor.signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        supervisor.start()
        sys.stdout.write(banner(layout, database_max_connections(env)) + "\n")
        sys.stdout.flush()
        supervisor.wait()
    finally:
        supervisor.stop()
    return 0
