"""One busy account, many websockets, two publishing processes: what one Daphne process sustains.

For each number of connections in BENCH_CONNECTIONS (1, 5, 50) and each posting rate in BENCH_RATES
(100, 200 postings/s): a fresh Daphne (PostgreSQL, Redis channel layer, the command line and pool
size `make run` gives it) holds
that many websockets on ONE listenKey of ONE account, and BENCH_POSTERS (2) separate processes
commit CHAIN_DEPOSITs to that account at the rate between them for BENCH_SECONDS (after a second of
warm-up). Each poster is a process with its own relay publisher thread, as each REST worker is, so
the account's sequences reach the server interleaved from two publishers.

Each poster records the wall clock right after each COMMIT (an after-commit listener that runs
before the relay's). Each client records when each outboundAccountPosition arrives; a posting is
matched to its event by the free balance after it, unique because every deposit raises it.

Printed per case: the posting rate reached, deliveries/s (postings delivered to all clients, counted
while the posters ran), p50/p99/max commit-to-receipt over every (client, posting), events missing
(never arrived within BENCH_DRAIN_SECONDS after the posters stopped: must be 0), duplicates and
out-of-order positions (must be 0), clients dropped, and the server's CPU (and the bench client's,
which shares the machine: it parses only the positions) while the posters ran.

Environment: BENCH_CONNECTIONS, BENCH_RATES, BENCH_POSTERS, BENCH_SECONDS, BENCH_DRAIN_SECONDS,
BENCH_DB_NAME, BENCH_REDIS_DB (a database of its own: it is dropped and flushed), BENCH_SETTINGS
(another DJANGO_SETTINGS_MODULE for the server and the posters, to try a change).
The run is invalid (exit status 1) when an event was lost or duplicated or a client dropped.

headline: p99 commit-to-receipt in ms with the most connections at the highest rate.
"""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from bench import _bench
from exchange.stack.layout import POOL_WS, ROOT
from exchange.stack.make_run import stack_command
from exchange.stack.ports import free_port

CONNECTIONS = [int(n) for n in os.environ.get("BENCH_CONNECTIONS", "1,5,50").split(",")]
RATES = [float(r) for r in os.environ.get("BENCH_RATES", "100,200").split(",")]
POSTERS = int(os.environ.get("BENCH_POSTERS", "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
DRAIN_SECONDS = float(os.environ.get("BENCH_DRAIN_SECONDS", "10"))
WARMUP_SECONDS = 1.0
DB_NAME = os.environ.get("BENCH_DB_NAME", "exchange_bench_stream_fanout")
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "11"))

SETUP = """
import json, sys
import django
django.setup()
from accounts import services
from streams.services import listen_key_start

out = []
for i in range(int(sys.argv[1])):
    user = services.user_create(email=f"fanout-bench-{i}@bench.example", password=None)
    out.append([user.pk, listen_key_start(account=user)])
print(json.dumps(out))
"""

POSTER = """
import json, sys, time
from decimal import Decimal
import django
django.setup()
from accounts import ledger
from accounts.models import SystemRole
from accounts.ledger.models import BalanceChange
from streams import relay

account = int(sys.argv[1])
rate, seconds, warmup = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
tag, out_path = sys.argv[5], sys.argv[6]
committed = []
# First among the after-commit listeners: the clock right after COMMIT, before the relay publishes.
ledger.after_commit_listeners.insert(0, lambda result: committed.append(time.time()))
world = ledger.system_account_id(SystemRole.WORLD)
amount = Decimal("0.001")
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()  # every poster and client is ready
records = []
start = time.time()
end = start + warmup + seconds
i = 0
while time.time() < end:  # paced at `rate`; a poster that falls behind posts back to back
    pause = start + i / rate - time.time()
    if pause > 0:
        time.sleep(pause)
    result = ledger.post(legs=ledger.move(world, account, "BTC", amount), kind="CHAIN_DEPOSIT",
                         reference=f"fanout-bench:{tag}:{i}")
    after = next(b for b in result.balances if b.account_id == account)
    records.append([after.seq, str(after.free), committed[-1], committed[-1] < start + warmup])
    i += 1
relay.drain(10)  # a worker stays alive: its relay publishes its last postings
with open(out_path, "w") as f:
    json.dump({"records": records, "started": start}, f)
"""


def run_python(env: dict[str, str], code: str, *args: str) -> str:
    return subprocess.run(
        [_bench.PYTHON, "-c", code, *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daphne(port: int) -> list[str]:
    """The websocket server exactly as `make run` starts it (exchange/stack.py), on `port`."""
    args = stack_command("ws")
    args[args.index("-p") + 1] = str(port)
    return args


class Client:
    """One websocket: when each position (by free balance) first arrived, duplicates, disorder."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.received: dict[Decimal, float] = {}
        self.duplicates = 0
        self.out_of_order = 0
        self.last = Decimal(-1)
        self.frames = 0

    async def listen(self) -> None:
        with contextlib.suppress(ConnectionClosed):  # counted as dropped
            async for message in self.ws:
                now = time.time()
                self.frames += 1
                if '"outboundAccountPosition"' not in message:
                    continue  # its balanceUpdate: not parsed, the client is the bench's bottleneck
                event = json.loads(message)
                free = Decimal(event["B"][0]["f"])
                if free in self.received:
                    self.duplicates += 1
                    continue
                if free <= self.last:
                    self.out_of_order += 1
                self.last = max(self.last, free)
                self.received[free] = now


async def run_case(env: dict[str, str], port: int, pid: int, account: int, key: str, clients_n: int, rate: float):
    sockets = await asyncio.gather(
        *(
            connect(
                f"ws://127.0.0.1:{port}/openapi/ws/{key}",
                compression=None,
                proxy=None,
                ping_interval=None,
                open_timeout=60,
                max_queue=None,
            )
            for _ in range(clients_n)
        )
    )
    clients = [Client(ws) for ws in sockets]
    listeners = [asyncio.create_task(client.listen()) for client in clients]
    await asyncio.sleep(0.5)
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"poster{n}.json" for n in range(POSTERS)]
        posters = [
            await asyncio.create_subprocess_exec(
                _bench.PYTHON,
                "-c",
                POSTER,
                str(account),
                str(rate / POSTERS),
                str(SECONDS),
                str(WARMUP_SECONDS),
                f"{clients_n}:{rate}:{n}",
                str(out),
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for n, out in enumerate(outs)
        ]
        for poster in posters:
            if (await poster.stdout.readline()).strip() != b"ready":
                _, err = await poster.communicate()
                sys.exit(f"poster failed:\n{err.decode()[-3000:]}")
        for poster in posters:
            poster.stdin.write(b"go\n")
            await poster.stdin.drain()
        cpu_before, client_before, cpu_at = cpu_seconds(pid), time.process_time(), time.time()
        for poster in posters:
            _, err = await poster.communicate()
            if poster.returncode != 0:
                sys.exit(f"poster failed:\n{err.decode()[-3000:]}")
        cpu = (cpu_seconds(pid) - cpu_before) / (time.time() - cpu_at)
        client_cpu = (time.process_time() - client_before) / (time.time() - cpu_at)
        results = [json.loads(out.read_text()) for out in outs]
    records = sorted((record for result in results for record in result["records"]), key=lambda r: r[0])
    measured = [r for r in records if not r[3]]
    wanted = {Decimal(free) for _, free, _, _ in measured}
    deadline = time.time() + DRAIN_SECONDS
    while time.time() < deadline and not all(wanted <= client.received.keys() for client in clients):
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # late duplicates
    dropped = sum(1 for client in clients if client.ws.state is not State.OPEN)
    for task in listeners:
        task.cancel()
    await asyncio.gather(*(client.ws.close() for client in clients), return_exceptions=True)

    window_start = min(r[2] for r in measured)
    window_end = max(r[2] for r in measured)
    latencies, missing, in_window = [], 0, 0
    for _, free, committed, _ in measured:
        for client in clients:
            at = client.received.get(Decimal(free))
            if at is None:
                missing += 1
                continue
            latencies.append((at - committed) * 1000)
            in_window += at <= window_end
    return {
        "postings": len(measured),
        "rate": len(measured) / (window_end - window_start),
        "deliveries_per_s": in_window / (window_end - window_start),
        "frames": sum(client.frames for client in clients),
        "latencies": latencies,
        "missing": missing,
        "duplicates": sum(client.duplicates for client in clients),
        "out_of_order": sum(client.out_of_order for client in clients),
        "dropped": dropped,
        "server_cpu": cpu,
        "client_cpu": client_cpu,
        "sequences_complete": [r[0] for r in records] == list(range(records[0][0], records[0][0] + len(records))),
    }


def main() -> None:
    caps = {"STREAM_MAX_CONNECTIONS_PER_KEY": "1000", "STREAM_MAX_CONNECTIONS_PER_IP": "1000"}
    env = _bench.bench_env(DB_NAME, REDIS_DB, **caps)
    if os.environ.get("BENCH_SETTINGS"):
        env["DJANGO_SETTINGS_MODULE"] = os.environ["BENCH_SETTINGS"]
    ws_env = {**env, "DB_POOL_MAX_SIZE": str(POOL_WS)}  # the pool make run gives Daphne
    _bench.recreate_database(env)
    _bench.manage(env, "demo", "--json")  # assets and system accounts
    cases = [(n, rate) for n in CONNECTIONS for rate in RATES]
    accounts = json.loads(run_python(env, SETUP, str(len(cases))))
    print(f"server: daphne (one process), PostgreSQL, Redis channel layer; {POSTERS} posting processes, one account")
    invalid = False
    headline = float("nan")
    for (clients_n, rate), (account, key) in zip(cases, accounts, strict=True):
        port = free_port()
        with _bench.process(daphne(port), ws_env, port) as server:
            result = asyncio.run(run_case(env, port, server.pid, account, key, clients_n, rate))
        values = result["latencies"]
        name = f"c{clients_n}_r{rate:.0f}"
        print(f"{name}_posting_rate_per_s: {result['rate']:.0f}")
        print(f"{name}_deliveries_per_s: {result['deliveries_per_s']:.0f}")
        if values:
            print(f"{name}_p50_ms: {percentile(values, 0.50):.1f}")
            print(f"{name}_p99_ms: {percentile(values, 0.99):.1f}")
            print(f"{name}_max_ms: {max(values):.1f}")
        print(f"{name}_missing: {result['missing']}")
        print(f"{name}_duplicates: {result['duplicates']}")
        print(f"{name}_out_of_order: {result['out_of_order']}")
        print(f"{name}_clients_dropped: {result['dropped']}")
        print(f"{name}_server_cpu_percent: {result['server_cpu'] * 100:.0f}")
        print(f"{name}_bench_client_cpu_percent: {result['client_cpu'] * 100:.0f}")
        sys.stdout.flush()
        if not result["sequences_complete"]:
            print(f"{name}: the posters' sequences have holes (another writer on the account?)")
        invalid |= bool(result["missing"] or result["duplicates"] or result["out_of_order"] or result["dropped"])
        headline = percentile(values, 0.99) if values else float("nan")
    print(f"headline: {headline:.1f}")
    if invalid:
        sys.exit("events were lost, duplicated or reordered, or clients dropped; the figures are not valid")


if __name__ == "__main__":
    main()
