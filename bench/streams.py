"""User data stream on the stack exactly as `make run` starts it (harness: nginx in front of
granian and one Daphne, Celery worker and beat, PostgreSQL, Redis channel layer); websockets connect
through nginx's one port, as clients do.

1. Latency from commit to receipt: CLIENTS websocket clients (each its own account and listenKey)
   connected to the stack's Daphne; a separate process posts CHAIN_DEPOSITs at RATE postings/s for SECONDS,
   round robin over the accounts, and records the wall clock right after each COMMIT (an
   after-commit listener that runs before the relay's). Each client records when each
   outboundAccountPosition arrives; a posting is matched to its event by (account, free after),
   unique because every deposit raises the balance. Target p99 < 50 ms.
   The poster reports the rate it reached: each posting also pays for the relay's fast path.
2. One busy account from several processes: BUSY_CLIENTS (5) websockets on ONE listenKey of ONE
   account, BUSY_POSTERS (2) separate processes (each with its own relay publisher, as each REST
   worker has) commit deposits to that account at BUSY_RATE (100) postings/s between them: the
   account's sequences reach the server interleaved from two publishers. Every client must get every
   posting (0 missing); p50/p99 commit-to-receipt over every (client, posting). Target p99 < 50 ms.
3. Memory: VmRSS of the stack's Daphne process holding IDLE idle websocket connections (through
   nginx). Target < 200 MB. Also its CPU use while they idle.
4. Publisher CPU (in a process of its own, before the other phases): one process posts
   PUBLISHER_POSTINGS deposits one after the other, in rounds with and without the ledger's after-
   commit listeners (the relay's fast path), and reports the process's CPU ms per posting
   (time.process_time, the publisher thread included, waiting until it has published everything) of
   each; the difference is what publishing costs the web and worker processes per posting. Twice:
   nobody listening to the accounts, and every account's group with a member (a channel nobody
   reads, so each posting is really sent).

Environment: BENCH_CLIENTS, BENCH_RATE, BENCH_SECONDS, BENCH_POSTERS, BENCH_BUSY_CLIENTS,
BENCH_BUSY_RATE, BENCH_BUSY_POSTERS, BENCH_IDLE_CONNECTIONS,
BENCH_PUBLISHER_POSTINGS (0 skips phase 4), BENCH_PUBLISHER_ONLY=1 (phase 4 alone), and
BENCH_SETTINGS (another DJANGO_SETTINGS_MODULE for the server and the posters, to try a change).
The run is invalid (exit status 1) when an event was lost or an idle connection dropped.

headline: p99 commit-to-receipt latency in ms of phase 1 (phase 2's is printed as busy_p99_ms).
"""

import asyncio
import contextlib
import json
import os
import resource
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
from harness.layout import ROOT
from harness.make_run import make_run

CLIENTS = int(os.environ.get("BENCH_CLIENTS", "100"))
RATE = float(os.environ.get("BENCH_RATE", "200"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
POSTERS = int(os.environ.get("BENCH_POSTERS", "1"))  # posting processes sharing RATE (and the accounts)
BUSY_CLIENTS = int(os.environ.get("BENCH_BUSY_CLIENTS", "5"))
BUSY_RATE = float(os.environ.get("BENCH_BUSY_RATE", "100"))
BUSY_POSTERS = int(os.environ.get("BENCH_BUSY_POSTERS", "2"))
WARMUP_SECONDS = 1.0
IDLE = int(os.environ.get("BENCH_IDLE_CONNECTIONS", "1000"))
DRAIN_SECONDS = 3.0
PUBLISHER_POSTINGS = int(os.environ.get("BENCH_PUBLISHER_POSTINGS", "300"))
PUBLISHER_ROUNDS = 3
PUBLISHER_ACCOUNTS = 50


def run_python(env: dict[str, str], module: str, *args: str) -> str:
    """`python -m module args` in the project with `env`: what it printed."""
    return subprocess.run(
        [_bench.PYTHON, "-m", module, *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def open_clients(port: int, keys: list[str], batch: int = 50) -> list:
    clients = []
    for start in range(0, len(keys), batch):
        clients += await asyncio.gather(
            *(
                connect(
                    f"ws://127.0.0.1:{port}/openapi/ws/{key}",
                    compression=None,
                    proxy=None,
                    ping_interval=None,
                    open_timeout=60,
                    max_queue=None,
                )
                for key in keys[start : start + batch]
            )
        )
    return clients


async def latency_phase(env: dict[str, str], port: int, accounts: list[list]) -> dict:
    clients = await open_clients(port, [key for _, key in accounts])
    received: dict[tuple[int, Decimal], tuple[float, int]] = {}  # -> receipt time, event time E (ms)
    updates = 0

    async def listen(account: int, ws) -> None:
        nonlocal updates
        with contextlib.suppress(ConnectionClosed):  # counted below
            async for message in ws:
                now = time.time()
                event = json.loads(message)
                if event["e"] == "outboundAccountPosition":
                    for balance in event["B"]:
                        if balance["a"] == "BTC":
                            received.setdefault((account, Decimal(balance["f"])), (now, event["E"]))
                elif event["e"] == "balanceUpdate":
                    updates += 1

    listeners = [asyncio.create_task(listen(account, ws)) for (account, _), ws in zip(accounts, clients, strict=True)]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"poster{n}.json" for n in range(POSTERS)]
        posters = [
            await asyncio.create_subprocess_exec(
                _bench.PYTHON,
                "-m",
                "bench.programs.stream_poster",
                json.dumps([account for account, _ in accounts[n::POSTERS]]),
                str(RATE / POSTERS),
                str(SECONDS),
                str(WARMUP_SECONDS),
                str(out),
                cwd=ROOT,
                env=env,
                stderr=subprocess.PIPE,
            )
            for n, out in enumerate(outs)
        ]
        for poster in posters:
            _, err = await poster.communicate()
            if poster.returncode != 0:
                sys.exit(f"poster failed:\n{err.decode()[-3000:]}")
        await asyncio.sleep(DRAIN_SECONDS)
        records = [record for out in outs for record in json.loads(out.read_text())["records"]]
    dropped = sum(1 for ws in clients if ws.state is not State.OPEN)
    for task in listeners:
        task.cancel()
    await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)

    measured = [r for r in records if not r[3]]
    latencies, server_ms, missing = [], [], 0
    for account, free, committed, _ in measured:
        found = received.get((account, Decimal(free)))
        if found is None:
            missing += 1
        else:
            latencies.append((found[0] - committed) * 1000)
            server_ms.append(found[1] - committed * 1000)  # commit -> the consumer built the event
    rate = len(measured) / SECONDS
    return {
        "postings": len(measured),
        "rate": rate,
        "missing": missing,
        "latencies": latencies,
        "server_ms": server_ms,
        "balance_updates": updates,
        "dropped": dropped,
    }


async def busy_phase(env: dict[str, str], port: int, account: int, key: str) -> dict:
    """BUSY_CLIENTS websockets on one listenKey; BUSY_POSTERS processes post to its one account."""
    clients = await open_clients(port, [key] * BUSY_CLIENTS)
    received: list[dict[Decimal, float]] = [{} for _ in clients]
    duplicates = 0

    async def listen(n: int, ws) -> None:
        nonlocal duplicates
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                now = time.time()
                event = json.loads(message)
                if event["e"] == "outboundAccountPosition":
                    for balance in event["B"]:
                        if balance["a"] == "BTC":
                            free = Decimal(balance["f"])
                            duplicates += free in received[n]
                            received[n].setdefault(free, now)

    listeners = [asyncio.create_task(listen(n, ws)) for n, ws in enumerate(clients)]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"busy{n}.json" for n in range(BUSY_POSTERS)]
        posters = [
            await asyncio.create_subprocess_exec(
                _bench.PYTHON,
                "-m",
                "bench.programs.stream_poster",
                json.dumps([account]),
                str(BUSY_RATE / BUSY_POSTERS),
                str(SECONDS),
                str(WARMUP_SECONDS),
                str(out),
                cwd=ROOT,
                env=env,
                stderr=subprocess.PIPE,
            )
            for out in outs
        ]
        for poster in posters:
            _, err = await poster.communicate()
            if poster.returncode != 0:
                sys.exit(f"poster failed:\n{err.decode()[-3000:]}")
        await asyncio.sleep(DRAIN_SECONDS)
        records = [record for out in outs for record in json.loads(out.read_text())["records"]]
    dropped = sum(1 for ws in clients if ws.state is not State.OPEN)
    for task in listeners:
        task.cancel()
    await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)
    measured = [r for r in records if not r[3]]
    latencies, missing = [], 0
    for _, free, committed, _ in measured:
        for seen in received:
            at = seen.get(Decimal(free))
            if at is None:
                missing += 1
            else:
                latencies.append((at - committed) * 1000)
    return {
        "postings": len(measured),
        "rate": len(measured) / SECONDS,
        "missing": missing,
        "duplicates": duplicates,
        "latencies": latencies,
        "dropped": dropped,
    }


def daphne_pid(stack_pid: int) -> int:
    """The stack's Daphne process: the descendant of `make run` whose command line runs daphne."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                raw = (entry / "stat").read_text()
                children.setdefault(int(raw[raw.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    todo = [stack_pid]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            if any(part.endswith(b"/daphne") for part in argv[:2]):
                return pid
        todo.extend(children.get(pid, []))
    raise RuntimeError("no Daphne process in the stack")


async def memory_phase(pid: int, port: int, keys: list[str]) -> dict:
    probe = await open_clients(port, keys[:1])  # everything imported and warmed once
    await probe[0].close()
    await asyncio.sleep(1)
    baseline = rss_kb(pid)
    started = time.time()
    clients = await open_clients(port, keys)
    connect_seconds = time.time() - started
    await asyncio.sleep(5)
    cpu_before, idle_start = cpu_seconds(pid), time.time()
    await asyncio.sleep(10)
    idle_cpu = (cpu_seconds(pid) - cpu_before) / (time.time() - idle_start)
    held = rss_kb(pid)
    still_open = sum(1 for ws in clients if ws.state is State.OPEN)
    await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)
    return {
        "baseline_kb": baseline,
        "held_kb": held,
        "open": still_open,
        "connect_seconds": connect_seconds,
        "idle_cpu": idle_cpu,
    }


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE * 2 + 512
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    # One client address opens them all here: room above the per-IP cap.
    env = _bench.bench_env("exchange_bench_streams", 13, STREAM_MAX_CONNECTIONS_PER_IP=str(IDLE + 1000))
    if os.environ.get("BENCH_SETTINGS"):  # try the servers and processes with other settings
        env["DJANGO_SETTINGS_MODULE"] = os.environ["BENCH_SETTINGS"]
    with make_run(env) as running:  # a fresh database, migrate, the demo world, the stack
        accounts = json.loads(
            run_python(env, "bench.programs.stream_accounts", str(max(IDLE, CLIENTS, PUBLISHER_ACCOUNTS) + 1))
        )
        busy_account, busy_key = accounts.pop()
        if PUBLISHER_POSTINGS:
            publisher = json.loads(
                run_python(
                    env,
                    "bench.programs.stream_publisher",
                    json.dumps([account for account, _ in accounts[:PUBLISHER_ACCOUNTS]]),
                    str(PUBLISHER_POSTINGS),
                    str(PUBLISHER_ROUNDS),
                )
            )
            for case, cpu in publisher.items():
                print(f"posting_cpu_ms_without_publisher_{case}: {cpu['without']:.2f}")
                print(f"publisher_cpu_ms_per_posting_{case}: {cpu['with'] - cpu['without']:.2f}")
            if os.environ.get("BENCH_PUBLISHER_ONLY") == "1":
                return
        port = running.port
        latency = asyncio.run(latency_phase(env, port, accounts[:CLIENTS]))
        busy = asyncio.run(busy_phase(env, port, busy_account, busy_key))
        memory = asyncio.run(memory_phase(daphne_pid(running.pid), port, [key for _, key in accounts[:IDLE]]))

    values = latency["latencies"]
    p99 = percentile(values, 0.99) if values else float("nan")
    print(
        "server: make run (nginx, granian, one Daphne, Celery), PostgreSQL, Redis channel layer; "
        f"{CLIENTS} clients, {POSTERS} poster(s)"
    )
    print(f"posting_rate_target_per_s: {RATE:.0f}")
    print(f"posting_rate_per_s: {latency['rate']:.0f}")
    print(f"postings_measured: {latency['postings']}")
    print(f"events_missing: {latency['missing']}")
    print(f"clients_dropped: {latency['dropped']}")
    if values:
        print(f"p50_ms: {percentile(values, 0.50):.1f}")
        print(f"p90_ms: {percentile(values, 0.90):.1f}")
        print(f"p99_ms: {p99:.1f}")
        print(f"max_ms: {max(values):.1f}")
        print(f"server_p50_ms: {percentile(latency['server_ms'], 0.50):.1f}")
        print(f"server_p99_ms: {percentile(latency['server_ms'], 0.99):.1f}")
    busy_values = busy["latencies"]
    print(
        f"busy_account: {BUSY_CLIENTS} websockets on one listenKey, {BUSY_POSTERS} posting processes, "
        f"{busy['rate']:.0f} postings/s (target {BUSY_RATE:.0f})"
    )
    print(f"busy_events_missing: {busy['missing']}")
    print(f"busy_events_duplicated: {busy['duplicates']}")
    print(f"busy_clients_dropped: {busy['dropped']}")
    if busy_values:
        print(f"busy_p50_ms: {percentile(busy_values, 0.50):.1f}")
        print(f"busy_p99_ms: {percentile(busy_values, 0.99):.1f}")
        print(f"busy_max_ms: {max(busy_values):.1f}")
    print(f"idle_connections: {IDLE}")
    print(f"idle_connections_open: {memory['open']}")
    print(f"idle_connect_seconds: {memory['connect_seconds']:.1f}")
    print(f"rss_baseline_mb: {memory['baseline_kb'] / 1024:.1f}")
    print(f"rss_idle_connections_mb: {memory['held_kb'] / 1024:.1f}")
    print(f"rss_per_connection_kb: {(memory['held_kb'] - memory['baseline_kb']) / IDLE:.1f}")
    print(f"idle_cpu_percent: {memory['idle_cpu'] * 100:.1f}")
    print(f"headline: {p99:.1f}")
    if latency["missing"] or latency["dropped"] or busy["missing"] or busy["duplicates"] or busy["dropped"]:
        sys.exit("events were lost or duplicated or connections dropped; the figures are not valid")
    if memory["open"] != IDLE:
        sys.exit("events were lost or connections dropped; the figures are not valid")


if __name__ == "__main__":
    main()
