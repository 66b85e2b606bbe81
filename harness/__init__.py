"""The code that runs the stack, in one place: the full stack as production runs it, started by one
command (`make run` with DATABASE_URL and REDIS_URL set, or `python -m harness`), and by the
benchmarks, the fault tests, the chaos runner and the simulation the same way:

    clients ──> nginx 127.0.0.1:$PORT ─┬─ /openapi/ws/ ─> Daphne (websocket), 127.0.0.1:$PORT+2...
                                       └─ everything else ─> granian WSGI (REST, admin, docs), 127.0.0.1:$PORT+1
    Celery worker (tasks) and Celery beat (the schedule), PostgreSQL, Redis.

- REST on granian's WSGI interface, one worker per core (`STACK_REST_WORKERS`), each with
  `STACK_REST_THREADS` blocking threads; the websocket on `STACK_WS_PROCESSES` Daphne processes
  (one port each, nginx spreads connections over them); one Celery worker
  (`STACK_CELERY_CONCURRENCY` processes) and one beat.
- Every web process has a bounded pool of PostgreSQL connections (DB_POOL_MAX_SIZE, set per kind of
  process in programs.py); a Celery process keeps one connection per thread (its task's and its
  publisher's); `Layout.connection_budget()` is the most the stack can open, printed at start and
  checked against the server's max_connections (docs/operations.md, "Database connections").
- nginx overwrites X-Forwarded-For with its peer's address and the backends trust 127.0.0.1
  (TRUSTED_PROXIES), so limits and API-key IP lists see the client's address; nginx's access log is
  buffered (var/stack/access.log), the backends' are off.
- supervisord (supervisor.py) runs the programs: one that exits is started again; SIGINT or SIGTERM
  stops everything (granian and Daphne finish the requests in flight).

Modules: layout (ports, process counts, connection budget, environment), nginx (its configuration),
programs (the command lines), supervisor (supervisord's configuration, start, stop, pid of a
program), loglines (supervisord's listener naming each program's output), run (`make run`'s entry),
ports (free ports, waiting), services (the shared PostgreSQL and Redis: private databases,
manage.py, the demo world, processes that are always stopped), demo_world (migrate and the demo
world in one process), private (a PostgreSQL cluster and a Redis server of one's own), make_run
(`make run` itself as a subprocess), client (signed HTTP and websocket clients), and the packages
chaos (faults under load), simulation (`python -m harness.simulation`) and lab (the HA lab).

The harness is tooling around the product, not part of it: production runs none of it and nothing
of the product imports it. It runs the project as processes and talks to it over HTTP, websocket,
SQL and manage.py; of the product's code it imports only the replay memory's keys and, in the lab's
bench_accounts, the ledger (tests/test_dependencies.py's HARNESS_IMPORTS, docs/architecture.md).
Every program it starts is a module (`python -m ...` or a file), never a `python -c` string.
"""
