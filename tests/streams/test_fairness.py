"""Fairness in the stream, on a real Daphne (PostgreSQL, Redis channel layer) over TCP (docs/streams.md,
Delivery: "One account cannot hold the others back", and Bounds: 4006).

One run (the `flood` fixture) floods one account (the demo peer): two processes commit deposits to
it at FLOOD_RATE between them while FLOOD_READING websockets read its listenKey and FLOOD_STALLED more
hold it open and read nothing (a client that stopped reading: its frames pile up in the server).
Meanwhile the demo master receives a deposit every TICK_SECONDS on one websocket, from a third
process. The flooded clients run in a process of their own, so that their reading does not delay
the master's client. The tests then read what each side saw:
- the master's events all arrive, none later than STREAM_MAX_LAG_SECONDS after its commit (the
  bound every connection is held to; a flood that held the process back made them seconds late)
  and half of them within 100 ms (the median of about 200 samples, not a tail of a few);
- every stalled connection is closed by its own lag check (the consumer's log line "Closing a
  stream ... (4006, too slow)", which the hub's shedding does not write: it says "the hub is
  behind"), and every reading connection got every event or was closed 4006 itself, never
  silently late.
Each was run with its feature removed (docs/streams.md says how; the report of session 42).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import time
from decimal import Decimal

import pytest
import requests
from websockets.asyncio.client import connect

from tests.support.stack import (
    FAIRNESS_DB_NAME,
    FAIRNESS_REDIS_DB,
    PYTHON,
    ROOT,
    daphne,
    daphne_env,
    load_demo,
    private_services,
    requires_services,
)
from tests.support.waiting import DEADLINE_SECONDS

pytestmark = [requires_services(FAIRNESS_REDIS_DB), pytest.mark.timeout(240)]

SECONDS = 8.0
FLOOD_RATE = 300  # postings/s to the flooded account, from two processes
FLOOD_READING = 8
FLOOD_STALLED = 40
TICK_SECONDS = 0.04  # the other account: 25 deposits a second, about 200 samples
MAX_LAG_SECONDS = 1.0  # the server's STREAM_MAX_LAG_SECONDS (its default)
SLACK_SECONDS = 0.5  # beyond the server: the network and the flooded clients' own process
CONSUMER_CLOSE = "(4006, too slow)"  # streams/consumers.py check_lag's line; the hub writes "(4006, the hub is behind)"

POSTER = """
import json, os, sys, time
from decimal import Decimal
import django
django.setup()
from accounts import ledger
from accounts.models import SystemRole, User
from streams import relay

email, rate, seconds, out, source = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
committed = []
# First among the after-commit listeners: the wall clock right after COMMIT, before the relay's.
ledger.after_commit_listeners.insert(0, lambda result: committed.append(time.time()))
account = User.objects.get(email=email).pk
world = ledger.system_account_id(SystemRole(source))  # the flood's and the other's apart: no shared row lock
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()
records, start, i = [], time.time(), 0
while time.time() < start + seconds:
    pause = start + i / rate - time.time()
    if pause > 0:
        time.sleep(pause)
    result = ledger.post(legs=ledger.move(world, account, "BTC", Decimal("0.001")), kind="CHAIN_DEPOSIT",
                         reference=f"fairness:{os.getpid()}:{start}:{i}")
    after = next(b for b in result.balances if b.account_id == account)
    records.append([str(after.free), committed[-1]])
    i += 1
relay.drain(10)
with open(out, "w") as f:
    json.dump(records, f)
"""

# Reads the flooded account's key on FLOOD_READING connections and holds FLOOD_STALLED more unread.
# Told the last balance (stdin) once the posters are done, it waits until every reader has it or is
# closed, then reads what the stalled ones had been sent until each is closed (within a deadline).
FLOODED = """
import asyncio, json, socket, sys, time
from decimal import Decimal
from urllib.parse import urlsplit
from websockets.asyncio.client import connect

url, reading, stalled, out, deadline = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
host, port = urlsplit(url).hostname, urlsplit(url).port

async def read(ws, got):
    try:
        async for message in ws:
            now = time.time()
            if '"outboundAccountPosition"' in message:
                got[json.loads(message)["B"][0]["f"]] = now
    except ConnectionClosed:
        pass

async def main():
    kw = dict(compression=None, proxy=None, ping_interval=None, open_timeout=60)
    readers = [await connect(url, max_queue=None, **kw) for _ in range(reading)]
    # max_queue=1: the client library stops reading the socket once a frame waits unread; a small
    # receive buffer, so that what it does not read waits in the server (not in this client's kernel).
    stalls = []
    for _ in range(stalled):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, port))
        stalls.append(await connect(url, max_queue=1, sock=sock, **kw))
    got = [{} for _ in readers]
    tasks = [asyncio.create_task(read(ws, g)) for ws, g in zip(readers, got)]
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    last = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    last = Decimal(last.strip())
    end = time.monotonic() + deadline
    def finished(task, got):
        return task.done() or any(Decimal(free) == last for free in got)
    while time.monotonic() < end and not all(finished(task, g) for task, g in zip(tasks, got)):
        await asyncio.sleep(0.05)
    stall_got = [{} for _ in stalls]
    stall_tasks = [asyncio.create_task(read(ws, g)) for ws, g in zip(stalls, stall_got)]
    await asyncio.wait(stall_tasks, timeout=max(1.0, end - time.monotonic()))
    for task in tasks + stall_tasks:
        task.cancel()
    codes = [ws.close_code for ws in readers], [ws.close_code for ws in stalls]
    with open(out, "w") as f:
        json.dump({"reading": got, "reading_codes": codes[0], "stalled": stall_got, "stalled_codes": codes[1]}, f)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def server():
    with private_services(FAIRNESS_DB_NAME, FAIRNESS_REDIS_DB) as (database_url, redis_url):
        env = daphne_env(DATABASE_URL=database_url, REDIS_URL=redis_url)
        world = load_demo(env)
        # Production's pings (20 s, 30 s): a stalled client is not dropped for its silence here.
        with daphne(env, world, ping_interval=20, ping_timeout=30) as running:
            yield running


def listen_key(server, role: str) -> str:
    headers = {"X-SERVICE-APIKEY": server.world[role]["api_key"]}
    response = requests.post(f"{server.http}/openapi/v1/userDataStream", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["listenKey"]


def start(server, code: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen(  # noqa: S603
        [PYTHON, "-c", code, *args],
        cwd=ROOT,
        env=server.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        pytest.fail(f"helper process failed: {proc.stderr.read()[-3000:]}")
    return proc


def finish(proc: subprocess.Popen, timeout: float = 60) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@pytest.fixture(scope="module")
def flood(server, tmp_path_factory):
    """The one flood; what the other account, the flooded clients and the server saw."""
    tmp_path = tmp_path_factory.mktemp("fairness")
    flooded_key, other_key = listen_key(server, "peer"), listen_key(server, "master")
    results = tmp_path / "flooded.json"
    flooded = start(
        server,
        FLOODED,
        server.ws_url(flooded_key),
        str(FLOOD_READING),
        str(FLOOD_STALLED),
        str(results),
        str(DEADLINE_SECONDS),
    )
    outs = [tmp_path / f"poster{n}.json" for n in range(3)]
    peer, master = server.world["peer"]["email"], server.world["master"]["email"]
    posters = [
        start(server, POSTER, peer, str(FLOOD_RATE / 2), str(SECONDS), str(outs[0]), "world"),
        start(server, POSTER, peer, str(FLOOD_RATE / 2), str(SECONDS), str(outs[1]), "world"),
        start(server, POSTER, master, str(1 / TICK_SECONDS), str(SECONDS), str(outs[2]), "equity"),
    ]

    async def other_account() -> tuple[dict[str, float], dict[Decimal, float]]:
        received: dict[str, float] = {}

        async def read(ws) -> None:
            async for message in ws:
                if '"outboundAccountPosition"' in message:
                    received[json.loads(message)["B"][0]["f"]] = time.time()

        async with connect(server.ws_url(other_key), compression=None, proxy=None) as ws:
            reading = asyncio.create_task(read(ws))
            for poster in posters:
                poster.stdin.write("go\n")
                poster.stdin.flush()
            loop = asyncio.get_running_loop()
            for poster in posters:
                await loop.run_in_executor(None, finish, poster)
            commits = {Decimal(free): at for free, at in json.loads(outs[2].read_text())}
            # Until every one of its postings has arrived (or the deadline: the test names the missing).
            end = time.monotonic() + DEADLINE_SECONDS
            while time.monotonic() < end and not set(commits) <= {Decimal(free) for free in received}:
                await asyncio.sleep(0.05)
            reading.cancel()
        return received, commits

    other, other_commits = asyncio.run(other_account())
    flood_commits = {Decimal(free): at for out in outs[:2] for free, at in json.loads(out.read_text())}
    flooded.stdin.write(f"{max(flood_commits)}\n")
    flooded.stdin.flush()
    finish(flooded, timeout=DEADLINE_SECONDS * 3)
    # By the free balance after each posting (each deposit raises it); equal Decimals hash alike.
    return {
        "other": other,
        "other_commits": other_commits,
        "flood_commits": flood_commits,
        "seen": json.loads(results.read_text()),
        "log": server.log.read_text(errors="replace"),
        "log_tail": server.log_tail(),
    }


def test_a_flooded_account_never_delays_another_accounts_events(flood):
    other, commits = flood["other"], flood["other_commits"]
    assert len(commits) >= 0.75 * SECONDS / TICK_SECONDS, "the other account's poster fell far behind its rate"
    missing = set(commits) - {Decimal(free) for free in other}
    assert not missing, f"the other account's events missing: {sorted(missing)}"
    lags = sorted((other[free] - commits[Decimal(free)]) * 1000 for free in other)
    # The bound every connection is held to, 10 times the median's budget: a flood that holds the
    # process behind makes these seconds late (1.2 s before the hub; docs/streams.md).
    assert lags[-1] < MAX_LAG_SECONDS * 1000, f"the other account's events late: the latest {lags[-5:]} ms"
    assert statistics.median(lags) < 100, f"the other account's median {statistics.median(lags):.0f} ms"


def test_a_flooded_connection_is_never_silently_late(flood):
    """Every stalled connection is closed by its own lag check (4006); every reading one got every
    event on time or was closed the same way."""
    flood_commits, seen = flood["flood_commits"], flood["seen"]
    # A busy shared machine commits fewer (531 of 2,400 at a load average of 11); the stalled
    # connections being closed below is what shows the flood was enough.
    assert len(flood_commits) > FLOOD_RATE * SECONDS / 8, "the flood did not happen"
    for got, code in zip(seen["reading"], seen["reading_codes"], strict=True):
        late = [at - flood_commits[Decimal(free)] for free, at in got.items()]
        if code == 4006:
            assert not late or max(late) < MAX_LAG_SECONDS + SLACK_SECONDS, f"{max(late):.1f} s late, then closed"
            continue
        missed = set(flood_commits) - {Decimal(free) for free in got}
        assert not missed, f"a reading connection missed {len(missed)} events without being closed (code {code})"
        # Thousands of samples per connection: p99 is a tail of dozens, not a maximum.
        assert percentile(late, 0.99) < 1.0, f"a connection kept open {percentile(late, 0.99):.1f} s late"
    # A client that reads nothing cannot read the close either: the server drops its socket after the
    # close handshake's timeout and the client library reports 1006; the server logged its 4006.
    assert set(seen["stalled_codes"]) <= {4006, 1006}, seen["stalled_codes"]
    closed_by_their_check = flood["log"].count(CONSUMER_CLOSE)
    assert closed_by_their_check >= FLOOD_STALLED, (
        f"{closed_by_their_check} connections closed by their own lag check, {FLOOD_STALLED} stalled: "
        f"{flood['log_tail']}"
    )
