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

Then, with the REST load running (issue 29's shape; BENCH_REST=0 skips it): the stack `make run`
starts (nginx, granian, one Daphne, Celery), BENCH_REST_CLIENTS (32) signed clients moving USDT
between the demo master and peer through nginx (every transfer touches the peer), plus
BENCH_REST_EXTRA_RATE (200) deposits/s to the peer from two posting processes, for
BENCH_REST_SECONDS (15); BENCH_REST_WEBSOCKETS (64, the per-key cap) websockets on the peer's listenKey held by a
separate light client process (it reads raw frames and counts them: what one Daphne delivered, not
what a Python websocket library can parse), and the demo sub-account (one websocket, in this
process) receiving a deposit every 0.5 s. Printed: the frames/s delivered to the peer's websockets
while the load ran and the frames offered (every posting touching the peer x 2 frames x
websockets), connections closed (4006: too slow), positions missing on the connections left open,
the sub-account's commit to receipt p50/p99 and events missing, transfers/s, and the CPU of each kind
of process.

Environment: BENCH_CONNECTIONS, BENCH_RATES, BENCH_POSTERS, BENCH_SECONDS, BENCH_DRAIN_SECONDS,
BENCH_DB_NAME, BENCH_REDIS_DB (a database of its own: it is dropped and flushed), BENCH_SETTINGS
(another DJANGO_SETTINGS_MODULE for the server and the posters, to try a change), BENCH_REST,
BENCH_REST_CLIENTS, BENCH_REST_WEBSOCKETS, BENCH_REST_EXTRA_RATE, BENCH_REST_SECONDS, BENCH_REST_DB_NAME.
The run is invalid (exit status 1) when an event was lost or duplicated or a client dropped.

headline: frames/s one Daphne delivered with the REST load running (BENCH_REST=0: p99
commit-to-receipt in ms with the most connections at the highest rate).
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
from bench import fullstack as fullstack_bench
from harness import client as stack_client
from harness.layout import POOL_WS, ROOT
from harness.make_run import make_run, stack_command
from harness.ports import free_port
from harness.services import demo_keys

CONNECTIONS = [int(n) for n in os.environ.get("BENCH_CONNECTIONS", "1,5,50").split(",") if n]  # "": none
RATES = [float(r) for r in os.environ.get("BENCH_RATES", "100,200").split(",")]
POSTERS = int(os.environ.get("BENCH_POSTERS", "2"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
DRAIN_SECONDS = float(os.environ.get("BENCH_DRAIN_SECONDS", "10"))
WARMUP_SECONDS = 1.0
DB_NAME = os.environ.get("BENCH_DB_NAME", "exchange_bench_stream_fanout")
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "11"))
REST = os.environ.get("BENCH_REST", "1") != "0"
REST_CLIENTS = int(os.environ.get("BENCH_REST_CLIENTS", "32"))
# 64: the per-key cap, what one customer may open (the caps are lifted here for other values).
REST_WEBSOCKETS = int(os.environ.get("BENCH_REST_WEBSOCKETS", "64"))
REST_EXTRA_RATE = float(os.environ.get("BENCH_REST_EXTRA_RATE", "200"))
REST_SECONDS = float(os.environ.get("BENCH_REST_SECONDS", "15"))
REST_DB_NAME = os.environ.get("BENCH_REST_DB_NAME", "exchange_bench_stream_fanout_rest")
TICK_SECONDS = 0.5


def run_python(env: dict[str, str], module: str, *args: str) -> str:
    """`python -m module args` in the project with `env`: what it printed."""
    return subprocess.run(
        [_bench.PYTHON, "-m", module, *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daphne(port: int) -> list[str]:
    """The websocket server exactly as `make run` starts it (harness), on `port`."""
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
                "-m",
                "bench.programs.fanout_poster",
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


async def start_poster(env: dict[str, str], account: int, rate: float, seconds: float, tag: str, out: Path):
    poster = await asyncio.create_subprocess_exec(
        _bench.PYTHON,
        "-m",
        "bench.programs.fanout_poster",
        str(account),
        str(rate),
        str(seconds),
        "0",
        tag,
        str(out),
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if (await poster.stdout.readline()).strip() != b"ready":
        _, err = await poster.communicate()
        sys.exit(f"poster failed:\n{err.decode()[-3000:]}")
    return poster


def delivered_per_s(samples: list, start: float, end: float) -> float:
    """Frames/s between the samples nearest `start` and `end` (wall clock)."""
    first = min(samples, key=lambda sample: abs(sample[0] - start))
    last = min(samples, key=lambda sample: abs(sample[0] - end))
    return (last[1] - first[1]) / max(1e-9, last[0] - first[0])


async def rest_phase(running, fullstack) -> float:
    """The peer's websockets and the sub-account's while the REST load runs (see the docstring)."""
    env, port, host = running.env, running.port, "127.0.0.1"
    keys = demo_keys(env)
    book = fullstack.Book(env["DATABASE_URL"])
    ids = {role: book.user_id(keys[role]["email"]) for role in ("master", "peer", "sub")}
    master = stack_client.Signer(keys["master"]["api_key"], keys["master"]["secret_key"])
    peer = stack_client.Signer(keys["peer"]["api_key"], keys["peer"]["secret_key"])
    sub = stack_client.Signer(keys["sub"]["api_key"], keys["sub"]["secret_key"])
    peer_key, sub_key = await fullstack.listen_key(peer, port), await fullstack.listen_key(sub, port)
    admin_url = env["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    meter = fullstack.CpuMeter(running.pid, admin_url, env["DATABASE_URL"].rsplit("/", 1)[1])
    with tempfile.TemporaryDirectory() as tmp:
        counted = Path(tmp) / "counter.json"
        counter = await asyncio.create_subprocess_exec(
            _bench.PYTHON,
            "-m",
            "bench.programs.fanout_counter",
            host,
            str(port),
            f"/openapi/ws/{peer_key}",
            str(REST_WEBSOCKETS),
            str(counted),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if (await counter.stdout.readline()).strip() != b"ready":
            _, err = await counter.communicate()
            sys.exit(f"websocket counter failed:\n{err.decode()[-3000:]}")
        outs = [Path(tmp) / f"rest-poster{n}.json" for n in range(3)]
        posters = [
            await start_poster(env, ids["peer"], REST_EXTRA_RATE / 2, REST_SECONDS, f"rest:{n}", outs[n])
            for n in range(2)
        ]
        posters.append(await start_poster(env, ids["sub"], 1 / TICK_SECONDS, REST_SECONDS, "rest:sub", outs[2]))
        sub_ws = await connect(f"ws://{host}:{port}/openapi/ws/{sub_key}", compression=None, proxy=None)
        sub_client = Client(sub_ws)
        sub_task = asyncio.create_task(sub_client.listen())
        await asyncio.sleep(0.5)
        seq0 = book.seq(ids["peer"])
        tally = stack_client.Tally()
        until = time.monotonic() + REST_SECONDS

        def params_to(email):
            return lambda n: {"account": "USDT", "target_address": email, "amount": "0.01"}

        loads = [
            stack_client.signed_loop(
                host,
                port,
                *(
                    (master, params_to(keys["peer"]["email"]))
                    if i % 2 == 0
                    else (peer, params_to(keys["master"]["email"]))
                ),
                tally,
                until,
            )
            for i in range(REST_CLIENTS)
        ]
        meter.start()
        counter_cpu = cpu_seconds(counter.pid)
        window_start = time.time()
        for poster in posters:
            poster.stdin.write(b"go\n")
            await poster.stdin.drain()
        await asyncio.gather(*loads)
        window_end = time.time()
        cpu = meter.stop()
        counter_cpu = (cpu_seconds(counter.pid) - counter_cpu) / (window_end - window_start)
        for poster in posters:
            _, err = await poster.communicate()
            if poster.returncode != 0:
                sys.exit(f"poster failed:\n{err.decode()[-3000:]}")
        seq1 = await fullstack.settle(book, ids["peer"])
        await asyncio.sleep(2)
        counter.stdin.write(b"stop\n")
        await counter.stdin.drain()
        await counter.communicate()
        seen = json.loads(counted.read_text())
        sub_records = json.loads(outs[2].read_text())["records"]
    sub_task.cancel()
    await sub_ws.close()
    postings = book.postings_between(ids["peer"], seq0, seq1)
    offered = postings * 2 * REST_WEBSOCKETS / (window_end - window_start)
    delivered = delivered_per_s(seen["samples"], window_start, window_end)
    closed = [code for code in seen["codes"] if code is not None]
    open_positions = [n for n, code in zip(seen["positions"], seen["codes"], strict=True) if code is None]
    missing = sum(max(0, postings - n) for n in open_positions)
    lags = [
        (sub_client.received[Decimal(free)] - at) * 1000
        for _, free, at, _ in sub_records
        if Decimal(free) in sub_client.received
    ]
    sub_missing = sum(1 for _, free, _, _ in sub_records if Decimal(free) not in sub_client.received)
    ok = tally.statuses.get(200, 0)
    print(f"rest_transfers_per_s: {ok / REST_SECONDS:.0f} ({tally.summary()})")
    print(f"rest_peer_postings: {postings} ({postings / (window_end - window_start):.0f}/s)")
    print(f"rest_frames_offered_per_s: {offered:.0f}")
    print(f"rest_frames_delivered_per_s: {delivered:.0f}")
    print(f"rest_websockets_closed: {len(closed)} (codes {sorted(set(closed))})")
    print(f"rest_positions_missing_on_open_websockets: {missing}")
    print(f"rest_other_account_events: {len(sub_records)}, missing {sub_missing}")
    if lags:
        print(f"rest_other_account_p50_ms: {percentile(lags, 0.50):.1f}")
        print(f"rest_other_account_p99_ms: {percentile(lags, 0.99):.1f}")
    print(f"rest_{cpu}, websocket counter {counter_cpu * 100:.0f}%")
    return delivered


def main() -> None:
    caps = {"STREAM_MAX_CONNECTIONS_PER_KEY": "1000", "STREAM_MAX_CONNECTIONS_PER_IP": "1000"}
    env = _bench.bench_env(DB_NAME, REDIS_DB, **caps)
    if os.environ.get("BENCH_SETTINGS"):
        env["DJANGO_SETTINGS_MODULE"] = os.environ["BENCH_SETTINGS"]
    ws_env = {**env, "DB_POOL_MAX_SIZE": str(POOL_WS)}  # the pool make run gives Daphne
    _bench.recreate_database(env)
    _bench.manage(env, "demo", "--json")  # assets and system accounts
    cases = [(n, rate) for n in CONNECTIONS for rate in RATES]
    accounts = json.loads(run_python(env, "bench.programs.fanout_accounts", str(len(cases))))
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
    if REST:
        rest_env = _bench.bench_env(
            REST_DB_NAME,
            REDIS_DB,
            IP_WEIGHT_LIMIT_PER_MINUTE="1000000000",
            UID_WEIGHT_LIMIT_PER_MINUTE="1000000000",
            STREAM_MAX_CONNECTIONS_PER_KEY="1000",
            STREAM_MAX_CONNECTIONS_PER_IP="1000",
        )
        rest_env.pop("RATE_LIMIT_STORAGE_URL", None)
        if os.environ.get("BENCH_SETTINGS"):
            rest_env["DJANGO_SETTINGS_MODULE"] = os.environ["BENCH_SETTINGS"]
        fullstack = fullstack_bench
        print(
            f"with the REST load: make run's stack, {REST_CLIENTS} transfer clients, +{REST_EXTRA_RATE:.0f} "
            f"deposits/s, {REST_WEBSOCKETS} websockets on the peer's listenKey, {REST_SECONDS:.0f} s"
        )
        with make_run(rest_env) as running:
            headline = asyncio.run(rest_phase(running, fullstack))
    print(f"headline: {headline:.1f}")
    if invalid:
        sys.exit("events were lost, duplicated or reordered, or clients dropped; the figures are not valid")


if __name__ == "__main__":
    main()
