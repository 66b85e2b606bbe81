"""The programs the harness starts are modules, not `python -c` strings (issue 36, item 1): each run
here as the harness runs it."""

from __future__ import annotations

import json
import subprocess
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest

from harness.lab import config
from harness.services import load_demo, manage, python
from tests.support.stack import (
    FULLSTACK_DB_NAME,
    FULLSTACK_REDIS_DB,
    private_services,
    requires_services,
    stack_env,
)


class _Etcd(BaseHTTPRequestHandler):
    """etcd's /version: "not_decided" for the first answers, then a decided cluster version."""

    undecided = 2
    asked = 0

    def do_GET(self):
        type(self).asked += 1
        cluster = "not_decided" if type(self).asked <= self.undecided else "3.5.0"
        body = json.dumps({"etcdserver": "3.5.16", "etcdcluster": cluster}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_patroni_starts_once_etcds_cluster_version_is_decided():
    """The lab's Patroni program (config.patroni_args): Debian's Python runs etcd_wait.py, which asks
    etcd's /version until it is decided, then becomes the program (`exec`: the same pid)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Etcd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/version"
        started = subprocess.Popen(  # noqa: S603 - Debian's Python, the harness's own file
            [config.SYSTEM_PYTHON, str(config.ETCD_WAIT), url, "/bin/sh", "-c", 'echo "patroni $$ $0"', "yml"],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = started.communicate(timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert started.returncode == 0
    assert out.split() == ["patroni", str(started.pid), "yml"]  # exec: the pid supervisord holds is the program's
    assert _Etcd.asked == 3  # twice "not_decided", then decided: the program started once


@requires_services(FULLSTACK_REDIS_DB)
@pytest.mark.timeout(180)
def test_the_host_fault_runs_accounts_are_funded_through_the_ledger():
    """`python -m harness.demo_world` (services.load_demo: migrate and the demo world in one process),
    then `python -m harness.lab.bench_accounts COUNT` (hostfault.py): COUNT accounts of 1,000,000 PHP
    each and their keys, the ledger check passing after."""
    database = f"{FULLSTACK_DB_NAME}_benchaccounts"
    with private_services(database, FULLSTACK_REDIS_DB) as (database_url, redis_url):
        env = stack_env(DATABASE_URL=database_url, REDIS_URL=redis_url)
        world = load_demo(env)  # harness.services': a process of its own, not the test run's template
        assert world["peer"]["api_key"]
        made = python(env, "-m", "harness.lab.bench_accounts", "3")
        accounts = json.loads(made.stdout.strip().splitlines()[-1])
        assert [email for email, _, _ in accounts] == [f"lab{i}@bench.lab" for i in range(3)]
        assert all(key and secret for _, key, secret in accounts)
        with psycopg.connect(database_url) as conn:
            balances = conn.execute(
                "SELECT u.email, b.free FROM accounts_balance b JOIN accounts_user u ON u.id = b.account_id"
                " JOIN accounts_asset a ON a.id = b.asset_id"
                " WHERE a.code = 'PHP' AND u.email LIKE %s ORDER BY u.email",
                ["%@bench.lab"],
            ).fetchall()
        assert balances == [(f"lab{i}@bench.lab", Decimal(1_000_000)) for i in range(3)]
        assert manage(env, "ledger_check").returncode == 0
