"""The production WSGI application with per-phase CPU accounting, for bench/transfers'
`BENCH_PHASES=1` diagnostic round (never used outside the benchmarks).

Each phase's thread CPU time (time.thread_time: user + system of the calling thread, so waits for
the database or the GIL do not count) is added up per process and written, with the number of
requests and the process's whole CPU time since its first request, to
`$BENCH_PHASES_DIR/<pid>` every 200 requests. Phases nest: the app (Django's handler: middleware,
URL resolving, DRF, the view) includes the gateway and the transfer service; the service includes
the look-up, the limit check and the posting; "database calls" are every prepared statement's
round trip through psycopg, wherever it is made. The publisher is the streams relay's thread
(publishing to Redis and marking rows published). The rest of the process (granian's WSGI glue,
the keyring's listener thread, garbage collection) is what the process used beyond the app and the
publisher.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import defaultdict

from exchange.wsgi import application as _django_application

_DIR = os.environ["BENCH_PHASES_DIR"]
_totals: dict[str, float] = defaultdict(float)
_lock = threading.Lock()
_state = {"requests": 0, "cpu_start": None}


def _add(name: str, seconds: float) -> None:
    with _lock:
        _totals[name] += seconds


def _timed(name: str, function):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        began = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            _add(name, time.thread_time() - began)

    return timed


def _install() -> None:
    from accounts import keyring, limits, selectors
    from accounts.ledger.posting import api as posting
    from accounts.ledger.posting import postgres
    from exchange.api.views import GatewayApi
    from streams.relay import Publisher
    from wallet.transfers import services

    GatewayApi.initial = _timed("gateway", GatewayApi.initial)
    services.transfer_create = _timed("transfer service", services.transfer_create)
    services.transfer_parties = _timed("service: look-up", services.transfer_parties)
    limits.outflow_refusal = _timed("service: limit check", limits.outflow_refusal)
    posting._post = _timed("service: posting", posting._post)
    fetch = _timed("database calls", postgres.fetch_prepared)
    for module in (postgres, selectors, keyring):
        module.fetch_prepared = fetch
    Publisher._publish = _timed("publisher", Publisher._publish)
    Publisher._mark = _timed("publisher", Publisher._mark)


_install()


def _dump() -> None:
    requests = _state["requests"]
    lines = [f"requests {requests}", f"process {(time.process_time() - _state['cpu_start']) * 1000 / requests:.3f}"]
    lines += [f"{name} {seconds * 1000 / requests:.3f}" for name, seconds in _totals.items()]
    path = os.path.join(_DIR, str(os.getpid()))
    with open(path + ".tmp", "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def application(environ, start_response):
    if _state["cpu_start"] is None:
        with _lock:
            if _state["cpu_start"] is None:
                _state["cpu_start"] = time.process_time()
    began = time.thread_time()
    try:
        return _django_application(environ, start_response)
    finally:
        _add("app", time.thread_time() - began)
        with _lock:
            _state["requests"] += 1
            if _state["requests"] % 200 == 0:
                _dump()
