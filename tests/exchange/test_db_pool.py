"""The REST server's bounded connection pool (exchange/settings/base.py, docs/operations.md): a request
that cannot get a PostgreSQL connection within DB_POOL_TIMEOUT gets -1001 (HTTP 503), never a 500,
and the server serves normally once a connection is free again.

A real granian process (its WSGI interface, as in production) on a private database, with a pool of
ONE connection and 3 threads: a transfer holds the connection while it waits for a ledger row this
test keeps locked; a second request then finds the pool empty.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from urllib.parse import urlencode

import psycopg
import pytest

from tests.support.stack import (
    POOL_DB_NAME,
    POOL_REDIS_DB,
    PYTHON,
    free_port,
    load_demo,
    private_services,
    process,
    requires_services,
    stack_env,
    wait_for_port,
)

DB_NAME, REDIS_DB = POOL_DB_NAME, POOL_REDIS_DB  # this worker's (tests/support/stack.py)

pytestmark = [requires_services(REDIS_DB), pytest.mark.timeout(180)]


def _signed(world_entry: dict, params: dict) -> tuple[str, dict]:
    text = urlencode({**params, "timestamp": int(time.time() * 1000)})
    signature = hmac.new(world_entry["secret_key"].encode(), text.encode(), hashlib.sha256).hexdigest()
    return f"{text}&signature={signature}", {"X-SERVICE-APIKEY": world_entry["api_key"]}


@pytest.fixture(scope="module")
def server():
    with private_services(DB_NAME, REDIS_DB) as (database_url, redis_url):
        env = stack_env(
            DATABASE_URL=database_url,
            REDIS_URL=redis_url,
            DB_POOL_MAX_SIZE="1",
            DB_POOL_MIN_SIZE="0",
            DB_POOL_TIMEOUT="0.5",
            LOG_LEVEL="WARNING",
        )
        world = load_demo(env)
        port = free_port()
        args = [PYTHON, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--workers", "1", "--blocking-threads", "3", "--log-level", "warning", "--no-access-log"]
        args.append("exchange.wsgi:application")
        with process(args, env, "granian") as proc:
            wait_for_port(port, proc)
            yield f"http://127.0.0.1:{port}", world, database_url, proc


def test_a_request_that_finds_the_pool_empty_gets_1001_and_the_server_recovers(server):
    import requests

    base, world, database_url, proc = server
    master, peer = world["master"], world["peer"]
    query, headers = _signed(master, {})
    assert requests.get(f"{base}/openapi/v1/account?{query}", headers=headers, timeout=10).status_code == 200

    results: dict[str, requests.Response] = {}
    with psycopg.connect(database_url) as blocker:
        # The master's ledger row, locked: the transfer below waits for it, holding the pool's one connection.
        blocker.execute(
            "SELECT 1 FROM accounts_ledgeraccount l JOIN accounts_user u ON u.id = l.user_id"
            " WHERE u.email = %s FOR UPDATE",
            [master["email"]],
        )
        transfer_query, transfer_headers = _signed(
            master, {"account": "USDT", "target_address": peer["email"], "amount": "1"}
        )

        def transfer():
            results["transfer"] = requests.post(
                f"{base}/openapi/transfer/v4/transfers?{transfer_query}", headers=transfer_headers, timeout=30
            )

        thread = threading.Thread(target=transfer)
        thread.start()
        deadline = time.time() + 10
        while time.time() < deadline:  # until the transfer waits on the lock (its connection is taken)
            waiting = blocker.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.05)
        assert waiting, "the transfer never waited for the locked row"

        query, headers = _signed(peer, {})
        started = time.monotonic()
        refused = requests.get(f"{base}/openapi/v1/account?{query}", headers=headers, timeout=10)
        waited = time.monotonic() - started
        blocker.rollback()  # the row is free: the transfer goes on
    thread.join(timeout=30)

    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == -1001
    assert 0.4 <= waited < 5, waited  # DB_POOL_TIMEOUT, not a hang
    assert results["transfer"].status_code == 200, results["transfer"].text
    query, headers = _signed(peer, {})
    assert requests.get(f"{base}/openapi/v1/account?{query}", headers=headers, timeout=10).status_code == 200
    log = proc.tail()
    assert "Traceback" not in log, log
    assert "Database unavailable" in log, log  # logged as a warning, one line
