"""A withdrawal settles exactly once when a real Celery worker dies mid-settlement, and when the same
settlement task is delivered twice at the same time (issue 5, docs/architecture.md section 4).

The full stack runs as subprocesses on a private database (PostgreSQL `exchange_crash_test`, Redis db
8, loaded with `manage.py migrate` and `manage.py demo`): granian (its WSGI interface, as in production)
serves the signed POST /openapi/wallet/v1/withdraw/apply, and `celery -A exchange worker` (prefork,
Redis broker) settles. The worker imports a small test-only hook module (written at run time from HOOK below, put on
its PYTHONPATH and imported with Celery's `--include`):

- with CRASH_MARKER set, the first broadcast of the process tree is followed by SIGKILL of the pool
  child that made it (after the simulated chain committed the transaction, before the settlement
  posting): acks_late + reject_on_worker_lost must hand the message to a new child;
- with CRASH_WHOLE_WORKER also set, the whole worker (main process and pool) is SIGKILLed instead,
  as when a machine dies: the message stays unacknowledged in Redis (visibility timeout: an hour),
  and the service's own backstop, wallet.retry_stuck_withdrawals, must hand the withdrawal to
  another worker;
- with RACE_DIR set, every wallet.withdrawal_process task waits at the start until two of them are
  running, and again at the broadcast until both got there, so two deliveries for one withdrawal
  really run at the same time and race to settle.

The module fails (never skips) when PostgreSQL or Redis cannot be reached (`make test` starts them).
Runs that share one PostgreSQL and Redis at the same time need their own CRASH_DATABASE_NAME and
CRASH_REDIS_DB (the module drops the database and flushes the Redis database it uses).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.support.client import hmac_hex, now_ms
from tests.support.stack import (
    CRASH_DB_NAME,
    CRASH_REDIS_DB,
    PYTHON,
    ROOT,
    Proc,
    free_port,
    load_demo,
    manage,
    private_services,
    process,
    requires_services,
    stack_env,
    wait_for_port,
)

DB_NAME, REDIS_DB = CRASH_DB_NAME, CRASH_REDIS_DB  # this worker's (tests/support/stack.py)
SETTLE_SECONDS = 30  # apply -> SUCCEEDED, a lost pool child included
ETH_ADDRESS = "0x00000000000000000000000000000000000d3e40"  # the demo master's ETH whitelist entry
ETH_FEE = Decimal("0.005")  # the demo ETH network's withdrawal fee

HOOK = '''"""Test-only Celery worker hook written by tests/wallet/test_worker_crash.py."""

import os
import signal
import time

from celery.signals import task_postrun, task_prerun

_patched = []


def _patch_broadcast():
    if _patched:
        return
    from wallet.chain.simulator import SimulatedChain

    original = SimulatedChain.broadcast

    def broadcast(self, **kwargs):
        race = os.environ.get("RACE_DIR")
        if race:  # both deliveries reach the chain before either settles: the settlement race is real
            with open(os.path.join(race, f"broadcast-{os.getpid()}"), "w"):
                pass
            deadline = time.monotonic() + 15
            while sum(n.startswith("broadcast-") for n in os.listdir(race)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        tx_id = original(self, **kwargs)  # committed on the simulated chain
        marker = os.environ.get("CRASH_MARKER")
        if marker:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # crashed once already
                return tx_id
            os.write(fd, f"{os.getpid()} {kwargs['reference']} {tx_id}".encode())
            os.close(fd)
            if os.environ.get("CRASH_WHOLE_WORKER"):
                os.killpg(os.getpgrp(), signal.SIGKILL)  # the main process too (its own session)
            os.kill(os.getpid(), signal.SIGKILL)
        return tx_id

    SimulatedChain.broadcast = broadcast
    _patched.append(True)


@task_prerun.connect
def _before(task_id=None, task=None, **kwargs):
    _patch_broadcast()
    race = os.environ.get("RACE_DIR")
    if race and task.name == "wallet.withdrawal_process":
        with open(os.path.join(race, f"start-{task_id}"), "w") as out:
            out.write(str(os.getpid()))
        deadline = time.monotonic() + 15
        while sum(name.startswith("start-") for name in os.listdir(race)) < 2:
            if time.monotonic() > deadline:
                open(os.path.join(race, f"alone-{task_id}"), "w").close()
                break
            time.sleep(0.01)


@task_postrun.connect
def _after(task_id=None, task=None, retval=None, **kwargs):
    race = os.environ.get("RACE_DIR")
    if race and task.name == "wallet.withdrawal_process":
        with open(os.path.join(race, f"done-{task_id}"), "w") as out:
            out.write(str(retval))
'''


pytestmark = [requires_services(REDIS_DB), pytest.mark.timeout(120)]


# --- processes -------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; it is dead for our purpose.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


# --- the stack ---------------------------------------------------------------------------------------


@dataclass
class Stack:
    env: dict[str, str]
    world: dict
    port: int
    db: object  # a psycopg connection (autocommit) to the private database
    hook_dir: Path

    def apply(self, amount: str) -> int:
        import requests

        master = self.world["master"]
        params = {
            "coin": "ETH",
            "network": "ETH",
            "address": ETH_ADDRESS,
            "amount": amount,
            "recvWindow": 60000,
            "timestamp": now_ms(),
        }
        query = urlencode(params)
        signature = hmac_hex(master["secret_key"], query)
        response = requests.post(
            f"http://127.0.0.1:{self.port}/openapi/wallet/v1/withdraw/apply?{query}&signature={signature}",
            headers={"X-SERVICE-APIKEY": master["api_key"]},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return int(response.json()["id"])

    def one(self, sql: str, *args):
        return self.db.execute(sql, args).fetchone()

    def withdrawal(self, withdrawal_id: int) -> dict:
        row = self.one("SELECT stage, tx_id, attempts FROM wallet_withdrawal WHERE id = %s", withdrawal_id)
        return {"stage": row[0], "tx_id": row[1], "attempts": row[2]}

    def balance(self, *, email: str | None = None, role: str | None = None, coin: str = "ETH") -> tuple:
        """An account's free and locked; for a house role, the sums over its shards."""
        row = self.one(
            "SELECT SUM(b.free), SUM(b.locked) FROM accounts_balance b JOIN accounts_user u ON u.id = b.account_id"
            " JOIN accounts_asset a ON a.id = b.asset_id"
            " WHERE (u.email = %s OR u.system_role = %s) AND a.code = %s",
            email or "",
            role or "",
            coin,
        )
        return (row[0], row[1]) if row and row[0] is not None else (Decimal(0), Decimal(0))

    def wait_settled(self, withdrawal_id: int, worker: Proc) -> dict:
        deadline = time.time() + SETTLE_SECONDS
        while True:
            state = self.withdrawal(withdrawal_id)
            if state["stage"] in ("SUCCEEDED", "FAILED"):
                return state
            if time.time() > deadline:
                pytest.fail(f"withdrawal {withdrawal_id} still {state} after {SETTLE_SECONDS}s:\n{worker.tail()}")
            time.sleep(0.1)

    @contextlib.contextmanager
    def worker(self, name: str, concurrency: int, **extra_env: str):
        env = dict(self.env, PYTHONPATH=os.pathsep.join([str(self.hook_dir), str(ROOT)]), **extra_env)
        args = [PYTHON, "-m", "celery", "-A", "exchange", "worker", "--pool", "prefork"]
        args += ["--concurrency", str(concurrency), "--include", "crash_hook", "--loglevel", "info"]
        args += ["--hostname", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
        with process(args, env, name) as worker:
            yield worker

    def assert_settled_once(self, withdrawal_id: int, tx_id: str) -> None:
        references = [
            row[0]
            for row in self.db.execute(
                "SELECT reference FROM accounts_posting WHERE reference LIKE %s ORDER BY id",
                (f"withdrawal:{withdrawal_id}:%",),
            )
        ]
        assert references == [f"withdrawal:{withdrawal_id}:hold", f"withdrawal:{withdrawal_id}:settle"]
        broadcasts = self.db.execute(
            "SELECT tx_id FROM wallet_simtransaction WHERE client_reference = %s", (f"withdrawal:{withdrawal_id}",)
        ).fetchall()
        assert broadcasts == [(tx_id,)]

    def ledger_check(self) -> None:
        done = manage(self.env, "ledger_check", check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def _stack_env(database_url: str, redis_url: str) -> dict[str, str]:
    return stack_env(
        drop=("PYTHONPATH", "CRASH_MARKER", "CRASH_WHOLE_WORKER", "RACE_DIR"),
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        CELERY_TASK_ALWAYS_EAGER="false",
        TRUSTED_PROXIES="",  # the client's address is the server's peer, whatever X-Forwarded-For says
        UID_WEIGHT_LIMIT_PER_MINUTE="100000",
        IP_WEIGHT_LIMIT_PER_MINUTE="100000",
    )


@pytest.fixture(scope="module")
def stack():
    import psycopg

    with (
        tempfile.TemporaryDirectory(prefix="crash-hook-") as tmp,
        private_services(DB_NAME, REDIS_DB) as (database_url, redis_url),
    ):
        hook_dir = Path(tmp)
        (hook_dir / "crash_hook.py").write_text(HOOK)
        env = _stack_env(database_url, redis_url)
        world = load_demo(env)
        port = free_port()
        server_args = [PYTHON, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port)]
        server_args += ["--workers", "1", "--blocking-threads", "2", "--log-level", "warning", "--no-access-log"]
        server_args.append("exchange.wsgi:application")
        with (
            process(server_args, env, "granian") as server,
            psycopg.connect(env["DATABASE_URL"], autocommit=True) as db,
        ):
            wait_for_port(port, server)
            yield Stack(env, world, port, db, hook_dir)


# --- the tests ---------------------------------------------------------------------------------------


def test_rest_server_hands_the_peer_address_to_the_gateway(stack):
    """granian's WSGI environ carries the TCP peer as REMOTE_ADDR, which the gateway takes as the
    client's IP (limits, API key IP lists); a forged X-Forwarded-For from an untrusted peer is ignored."""
    import requests

    url = f"http://127.0.0.1:{stack.port}/openapi/v1/user/ip"
    assert requests.get(url, timeout=10).json() == {"ip": "127.0.0.1"}
    assert requests.get(url, headers={"X-Forwarded-For": "203.0.113.9"}, timeout=10).json() == {"ip": "127.0.0.1"}


def test_worker_killed_after_broadcast_settles_once(stack, tmp_path):
    """The pool child is SIGKILLed right after the chain accepted the transaction and before the
    settlement posting; the message is redelivered and the withdrawal settles once."""
    master = stack.world["master"]["email"]
    free_before, locked_before = stack.balance(email=master)
    fees_before = stack.balance(role="fees")[0]
    marker = tmp_path / "crashed"
    with stack.worker("crash", 1, CRASH_MARKER=str(marker)) as worker:
        withdrawal_id = stack.apply("0.3")
        state = stack.wait_settled(withdrawal_id, worker)
        assert worker.proc.poll() is None, f"the worker's main process died:\n{worker.tail()}"
        log = worker.tail()
    assert state["stage"] == "SUCCEEDED", log
    assert marker.exists(), f"the hook never killed a pool child:\n{log}"
    killed_pid, reference, first_tx_id = marker.read_text().split()
    assert reference == f"withdrawal:{withdrawal_id}"
    assert not _pid_alive(int(killed_pid))
    assert "WorkerLostError" in log or "SIGKILL" in log, log
    assert state["tx_id"] == first_tx_id  # the redelivered task got the first broadcast back
    assert state["attempts"] == 2  # the first run and the redelivery each count
    stack.assert_settled_once(withdrawal_id, first_tx_id)
    assert stack.balance(email=master) == (free_before - Decimal("0.3") - ETH_FEE, locked_before)
    assert stack.balance(role="fees")[0] == fees_before + ETH_FEE
    stack.ledger_check()


def test_whole_worker_killed_after_broadcast_settles_once_through_the_backstop(stack, tmp_path):
    """The worker's main process dies with its pool child (after the broadcast, before the posting):
    nothing redelivers the message soon, so wallet.retry_stuck_withdrawals (run here as beat would,
    with WITHDRAWAL_RETRY_AFTER_SECONDS=1) re-enqueues it and a fresh worker settles it once."""
    master = stack.world["master"]["email"]
    free_before, locked_before = stack.balance(email=master)
    fees_before = stack.balance(role="fees")[0]
    marker = tmp_path / "crashed"
    with stack.worker("doomed", 1, CRASH_MARKER=str(marker), CRASH_WHOLE_WORKER="1") as doomed:
        withdrawal_id = stack.apply("0.1")
        deadline = time.time() + SETTLE_SECONDS
        while doomed.proc.poll() is None:
            if time.time() > deadline:
                pytest.fail(f"the worker was not killed:\n{doomed.tail()}")
            time.sleep(0.1)
        assert doomed.proc.returncode == -signal.SIGKILL
    assert marker.exists()
    first_tx_id = marker.read_text().split()[2]
    assert stack.withdrawal(withdrawal_id)["stage"] == "BROADCASTING"  # broadcast, not settled
    import redis

    # The message waits, unacknowledged, for the broker's visibility timeout: Celery will not redeliver it soon.
    unacked = [json.loads(raw)[0]["headers"] for raw in redis.Redis.from_url(stack.env["REDIS_URL"]).hvals("unacked")]
    expected = {"task": "wallet.withdrawal_process", "argsrepr": f"({withdrawal_id},)"}.items()
    assert any(expected <= headers.items() for headers in unacked), unacked
    with stack.worker("rescue", 1) as rescue:
        time.sleep(1.1)  # older than WITHDRAWAL_RETRY_AFTER_SECONDS
        retry = "from wallet.tasks import retry_stuck_withdrawals_task as t; print(t())"
        env = dict(stack.env, WITHDRAWAL_RETRY_AFTER_SECONDS="1")
        assert manage(env, "shell", "--no-imports", "-c", retry).stdout.strip().splitlines()[-1] == "1"
        state = stack.wait_settled(withdrawal_id, rescue)
    assert state == {"stage": "SUCCEEDED", "tx_id": first_tx_id, "attempts": 2}
    stack.assert_settled_once(withdrawal_id, first_tx_id)
    assert stack.balance(email=master) == (free_before - Decimal("0.1") - ETH_FEE, locked_before)
    assert stack.balance(role="fees")[0] == fees_before + ETH_FEE
    stack.ledger_check()


def test_same_task_delivered_twice_concurrently_settles_once(stack, tmp_path):
    """Two deliveries of wallet.withdrawal_process for one withdrawal run at the same time in two pool
    children (the hook holds each at the start until both are running)."""
    from celery import Celery

    master = stack.world["master"]["email"]
    free_before, locked_before = stack.balance(email=master)
    fees_before = stack.balance(role="fees")[0]
    withdrawal_id = stack.apply("0.2")  # no worker yet: its task waits in the queue
    assert stack.withdrawal(withdrawal_id)["stage"] == "QUEUED"
    sender = Celery("crash-test-sender", broker=stack.env["REDIS_URL"], set_as_current=False)
    try:
        sender.send_task("wallet.withdrawal_process", args=[withdrawal_id], serializer="json")
    finally:
        sender.close()
    race = tmp_path / "race"
    race.mkdir()
    with stack.worker("race", 2, RACE_DIR=str(race)) as worker:
        state = stack.wait_settled(withdrawal_id, worker)
        deadline = time.time() + SETTLE_SECONDS
        while len(list(race.glob("done-*"))) < 2 and time.time() < deadline:
            time.sleep(0.1)
        log = worker.tail()
    assert len({p.read_text() for p in race.glob("start-*")}) == 2, log  # two deliveries, two pool children
    assert not list(race.glob("alone-*")), log  # each waited until the other was running
    assert sorted(p.read_text() for p in race.glob("done-*")) == ["SUCCEEDED", "SUCCEEDED"], log
    assert state["stage"] == "SUCCEEDED"
    assert state["attempts"] == 2  # both deliveries ran while it was broadcasting
    assert len(list(race.glob("broadcast-*"))) == 2, log  # both reached the chain before either settled
    stack.assert_settled_once(withdrawal_id, state["tx_id"])
    assert stack.balance(email=master) == (free_before - Decimal("0.2") - ETH_FEE, locked_before)
    assert stack.balance(role="fees")[0] == fees_before + ETH_FEE
    stack.ledger_check()
