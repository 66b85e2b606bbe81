"""The user data stream in the full stack, over TCP: a real Daphne server (PostgreSQL, Redis channel
layer) started as a subprocess, real websocket clients, and postings committed by another process.
The last test does the same against the embedded default (SQLite, in-memory channel layer), where
the server's own sweeper must publish what another process committed.

Each server gets a private database (PostgreSQL `exchange_fullstack_test`, Redis db 9, or SQLite in
a temporary directory), loaded with `manage.py migrate` and `manage.py demo`. The module fails
(never skips) when PostgreSQL or Redis cannot be reached (`make test` starts them).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from decimal import Decimal

import pytest
import requests
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support.stack import (
    FULLSTACK_DB_NAME,
    FULLSTACK_REDIS_DB,
    PING_INTERVAL,
    PING_TIMEOUT,
    PYTHON,
    ROOT,
    Server,
    daphne,
    daphne_env,
    load_demo,
    private_services,
    requires_services,
)

DELIVERY_SECONDS = 1.0  # commit in one process -> event at the client of the server

pytestmark = [requires_services(FULLSTACK_REDIS_DB), pytest.mark.timeout(180)]


# --- servers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_stack():
    with private_services(FULLSTACK_DB_NAME, FULLSTACK_REDIS_DB) as (database_url, redis_url):
        env = daphne_env(
            DATABASE_URL=database_url,
            REDIS_URL=redis_url,
            STREAM_CHANNEL_CAPACITY="100",  # small, so that a burst overflows it (see the burst test)
        )
        world = load_demo(env)
        with daphne(env, world) as server:
            yield server


@pytest.fixture(scope="module")
def embedded():
    """The embedded default: no REDIS_URL (in-memory channel layer and listenKey store), SQLite."""
    with tempfile.TemporaryDirectory(prefix="fullstack-embedded-") as tmp:
        env = daphne_env(DATABASE_URL=f"sqlite:///{tmp}/db.sqlite3", REDIS_URL="")
        world = load_demo(env)
        with daphne(env, world) as server:
            yield server


# --- a posting made by another process --------------------------------------------------------------

POSTER = """
import json, sys, time
from decimal import Decimal
import django
django.setup()
from accounts import ledger
from accounts.models import SystemRole, User

committed = []
# Runs first among the after-commit listeners: the wall clock right after COMMIT returned.
ledger.after_commit_listeners.insert(0, lambda result: committed.append(time.time()))
master = User.objects.get(email="master@demo.exchange")
world = ledger.system_account_id(SystemRole.WORLD)
amount, count = Decimal(sys.argv[1]), int(sys.argv[2])
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()  # the caller is ready (its websocket waits in recv())
for _ in range(count):
    result = ledger.post(
        legs=ledger.move(world, master.pk, "BTC", amount),
        kind="CHAIN_DEPOSIT",
        reference=f"fullstack:{time.time_ns()}",
    )
after = next(b for b in result.balances if b.account_id == master.pk)
report = {"commit": committed[-1], "free": str(after.free), "locked": str(after.locked), "posting": result.posting_id}
sys.stdout.write(json.dumps(report) + "\\n")
"""


class Poster:
    """A separate process that posts `count` CHAIN_DEPOSITs of `amount` BTC to the demo master
    once told to go (after Django is set up)."""

    def __init__(self, server: Server, amount: str, count: int = 1):
        self.server = server
        self.proc = subprocess.Popen(  # noqa: S603
            [PYTHON, "-c", POSTER, amount, str(count)],
            cwd=ROOT,
            env=server.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.proc.kill()
            pytest.fail(f"poster failed: {self.proc.stderr.read()[-3000:]}")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def report(self, timeout: float = 120) -> dict:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    def fail(self, why: str):
        self.proc.kill()
        _, err = self.proc.communicate()
        pytest.fail(f"{why}; poster stderr:\n{err[-3000:]}\nserver:\n{self.server.log_tail()}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _deposit_from_another_process(server: Server, ws, amount: str) -> tuple[list[tuple[float, dict]], dict]:
    """A CHAIN_DEPOSIT of `amount` BTC to the demo master committed by another process while `ws`
    waits: the two events it produces with their receipt times, and the poster's report."""
    with Poster(server, amount) as poster:
        return _receive_deposit(poster, ws)


def _receive_deposit(poster: Poster, ws) -> tuple[list[tuple[float, dict]], dict]:
    poster.go()
    received = []
    while len(received) < 2:
        try:
            message = ws.recv(timeout=15)
        except TimeoutError:
            poster.fail("no event")
        except ConnectionClosed as closed:
            poster.fail(f"the server closed the websocket: {closed}")
        received.append((time.time(), json.loads(message)))
    return received, poster.report()


def _check_deposit_events(received, posted, amount: str) -> float:
    (_, update), (received_at, position) = received
    assert update["e"] == "balanceUpdate", update
    assert update["a"] == "BTC"
    assert Decimal(update["d"]) == Decimal(amount)
    assert update["d"] == f"{Decimal(amount):.8f}"
    assert update["BS"] == "CHAIN_DEPOSIT"
    assert isinstance(update["E"], int)
    assert isinstance(update["T"], int)
    assert "em" not in update
    assert "BI" not in update
    assert position["e"] == "outboundAccountPosition", position
    assert position["u"] == update["T"]
    assert isinstance(position["E"], int)
    assert position["B"] == [
        {"a": "BTC", "f": f"{Decimal(posted['free']):.8f}", "l": f"{Decimal(posted['locked']):.8f}"}
    ]
    # Event T is the posting's time, set just before its commit.
    assert abs(update["T"] / 1000 - posted["commit"]) < 2
    return received_at - posted["commit"]


def test_posting_by_another_process_reaches_a_tcp_client_within_a_second(full_stack, record_property):
    key = full_stack.start_key()
    with Poster(full_stack, "0.125") as poster, connect(full_stack.ws_url(key), open_timeout=10, proxy=None) as ws:
        received, posted = _receive_deposit(poster, ws)
    latency = _check_deposit_events(received, posted, "0.125")
    record_property("commit_to_receipt_ms", round(latency * 1000, 1))
    assert 0 <= latency < DELIVERY_SECONDS, f"delivered {latency * 1000:.0f} ms after commit"


# --- closing ---------------------------------------------------------------------------------------


def test_delete_closes_the_tcp_websocket_and_kills_the_key(full_stack):
    key = full_stack.start_key()
    with connect(full_stack.ws_url(key), open_timeout=10, proxy=None) as ws:
        started = time.time()
        response = requests.delete(
            f"{full_stack.http}/openapi/v1/userDataStream",
            params={"listenKey": key},
            headers=full_stack.headers(),
            timeout=10,
        )
        assert response.status_code == 200, response.text
        assert response.json() == {}
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert time.time() - started < 2
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4001
    with pytest.raises(InvalidStatus), connect(full_stack.ws_url(key), open_timeout=10, proxy=None):
        pass  # a dead key is refused at the handshake
    response = requests.put(
        f"{full_stack.http}/openapi/v1/userDataStream",
        params={"listenKey": key},
        headers=full_stack.headers(),
        timeout=10,
    )
    assert response.json()["code"] == -1125


def _raw_handshake(port: int, path: str) -> socket.socket:
    """A websocket opening handshake by hand; returns the socket right after the 101 response."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    nonce = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: nothing after the head is consumed
        assert chunk, f"closed during the handshake: {head!r}"
        head += chunk
    status, *lines = head.decode().strip().split("\r\n")
    assert " 101 " in status, head
    headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    accept = base64.b64encode(
        hashlib.sha1((nonce + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode(), usedforsecurity=False).digest()
    )
    assert headers["sec-websocket-accept"] == accept.decode()
    return sock


def test_a_client_that_never_answers_pings_is_dropped(full_stack):
    key = full_stack.start_key()
    with connect(full_stack.ws_url(key), open_timeout=10, proxy=None) as live:
        sock = _raw_handshake(full_stack.port, f"/openapi/ws/{key}")
        opened = time.time()
        # From here the raw client never sends a byte (no pong, no close). It only watches for the
        # end of the connection.
        data, closed_at = b"", None
        sock.settimeout(0.25)
        deadline = opened + 20
        while time.time() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed_at = time.time()
                break
            if not chunk:
                closed_at = time.time()
                break
            data += chunk
        sock.close()
        assert closed_at is not None, "the server kept a client that never answered its pings"
        assert data[:1] == b"\x89", f"the server should have pinged first, got {data[:16]!r}"
        # Daphne checks every 2 s, pings after --ping-interval and drops after --ping-timeout.
        assert closed_at - opened < PING_INTERVAL + PING_TIMEOUT + 4
        # The client that answers pings (websockets does) is still there.
        assert live.ping().wait(3)
        time.sleep(PING_INTERVAL + PING_TIMEOUT + 2)
        assert live.ping().wait(3)


# --- quiet periods, crowds and bursts ---


def test_a_connection_survives_quiet_periods(full_stack):
    key = full_stack.start_key()
    with connect(full_stack.ws_url(key), open_timeout=10, proxy=None) as ws:
        with pytest.raises(TimeoutError):
            ws.recv(timeout=12)  # nothing happens on the account for 12 s
        received, posted = _deposit_from_another_process(full_stack, ws, "0.5")
    _check_deposit_events(received, posted, "0.5")


def test_a_process_that_exits_right_after_posting_publishes_its_posting(full_stack):
    import psycopg

    with Poster(full_stack, "0.01") as poster:
        os.kill(full_stack.proc.pid, signal.SIGSTOP)  # the server's sweeper cannot step in
        try:
            poster.go()
            posted = poster.report()
            with psycopg.connect(full_stack.env["DATABASE_URL"]) as db:
                unpublished = db.execute(
                    "SELECT count(*) FROM accounts_balancechange WHERE posting_id = %s AND published_at IS NULL",
                    [posted["posting"]],
                ).fetchone()[0]
        finally:
            os.kill(full_stack.proc.pid, signal.SIGCONT)
    assert unpublished == 0, "the posting process exited without publishing its posting"


ACCOUNTS_WITH_KEYS = """
import json, sys
import django
django.setup()
from accounts import services
from streams.services import listen_key_start

out = []
for i in range(int(sys.argv[1])):
    user = services.user_create(email=f"{sys.argv[2]}-{i}@fullstack.example", password=None)
    out.append([user.pk, listen_key_start(account=user)])
sys.stdout.write(json.dumps(out) + "\\n")
"""

BURST_POSTER = """
import json, sys, time
from decimal import Decimal
import django
django.setup()
from accounts import ledger
from accounts.ledger.models import BalanceChange
from accounts.models import SystemRole

accounts = json.loads(sys.argv[1])
world = ledger.system_account_id(SystemRole.WORLD)
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()
postings = [
    ledger.post(legs=ledger.move(world, account, "BTC", Decimal("0.5")), kind="CHAIN_DEPOSIT",
                reference=f"burst:{account}:{time.time_ns()}").posting_id
    for account in accounts
]
# Stay until this process's relay has published (and marked) every row, as a worker would.
deadline = time.time() + 30
while BalanceChange.objects.filter(posting_id__in=postings, published_at__isnull=True).exists():
    if time.time() > deadline:
        sys.exit("the relay did not publish")
    time.sleep(0.05)
sys.stdout.write("published\\n")
"""


def _accounts_with_keys(server: Server, count: int) -> list[list]:
    """`count` new accounts, each with a live listenKey: [[account id, key], ...]."""
    done = subprocess.run(  # noqa: S603
        [PYTHON, "-c", ACCOUNTS_WITH_KEYS, str(count), f"acct{time.time_ns()}"],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_many_clients_connecting_at_once_are_all_accepted(full_stack):
    accounts = _accounts_with_keys(full_stack, 300)

    async def connect_all() -> list:
        results = await asyncio.gather(
            *(aconnect(full_stack.ws_url(key), proxy=None, open_timeout=60) for _, key in accounts),
            return_exceptions=True,
        )
        await asyncio.gather(*(ws.close() for ws in results if not isinstance(ws, BaseException)))
        return [repr(error) for error in results if isinstance(error, BaseException)]

    for _ in range(3):  # how many fail depends on timing: try a few times
        failures = asyncio.run(connect_all())
        assert not failures, f"{len(failures)} of {len(accounts)} refused: {sorted(set(failures))[:3]}"


def test_a_burst_the_server_cannot_drain_at_once_is_not_lost(full_stack):
    """More messages than the channel layer holds for the server (STREAM_CHANNEL_CAPACITY, 100 here)
    arrive while it drains nothing: channels_redis drops the excess, yet every account gets its change
    (the consumers' periodic catch-up from the change feed)."""
    count = 150
    accounts = _accounts_with_keys(full_stack, count)

    async def scenario() -> dict[int, dict]:
        poster = await asyncio.create_subprocess_exec(
            PYTHON,
            "-c",
            BURST_POSTER,
            json.dumps([account for account, _ in accounts]),
            cwd=ROOT,
            env=full_stack.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert (await poster.stdout.readline()).strip() == b"ready"
        clients = []
        for start in range(0, count, 50):  # a few at a time (see the test above)
            clients += await asyncio.gather(
                *(
                    aconnect(full_stack.ws_url(key), proxy=None, open_timeout=30)
                    for _, key in accounts[start : start + 50]
                )
            )
        os.kill(full_stack.proc.pid, signal.SIGSTOP)  # the server is busy: it drains nothing meanwhile
        try:
            poster.stdin.write(b"go\n")
            await poster.stdin.drain()
            out, err = await asyncio.wait_for(poster.communicate(), 60)
        finally:
            os.kill(full_stack.proc.pid, signal.SIGCONT)
        assert out.strip().endswith(b"published"), err.decode()[-3000:]

        async def position(ws) -> dict | None:
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                async with asyncio.timeout(15):  # the catch-up runs every STREAM_KEY_CHECK_SECONDS (5)
                    while True:
                        event = json.loads(await ws.recv())
                        if event["e"] == "outboundAccountPosition":
                            return event
            return None

        try:
            events = await asyncio.gather(*(position(ws) for ws in clients))
        finally:
            await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)
        return {account: event for (account, _), event in zip(accounts, events, strict=True)}

    received = asyncio.run(scenario())
    missing = [account for account, event in received.items() if event is None]
    assert not missing, f"{len(missing)} of {count} accounts never received their deposit"
    for event in received.values():
        assert event["B"] == [{"a": "BTC", "f": "0.50000000", "l": "0.00000000"}]


# --- the embedded default ------------------------------------------------------------------------------


def test_embedded_default_delivers_postings_of_another_process(embedded, record_property):
    key = embedded.start_key()
    with Poster(embedded, "0.25") as poster, connect(embedded.ws_url(key), open_timeout=10, proxy=None) as ws:
        received, posted = _receive_deposit(poster, ws)
    latency = _check_deposit_events(received, posted, "0.25")
    record_property("commit_to_receipt_ms", round(latency * 1000, 1))
    assert 0 <= latency < DELIVERY_SECONDS, f"delivered {latency * 1000:.0f} ms after commit"
