"""bench/convert's load and measurements (kept apart so that the bench script stays readable): the
convert clients (HTTP/1.1 keep-alive, signing live), one round of them, the lock-wait sampler and
the CPU readings of the stack's processes, its PostgreSQL backends and Redis."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlencode

# (source, target, sourceAmount): every demo pair, small amounts, so a client's balances last
# (per cycle of 8 a client loses about 0.00007 BTC and 3.3 USDT to the spread and the round trips).
PLAN = [
    ("PHP", "BTC", "100"),
    ("BTC", "PHP", "0.0001"),
    ("PHP", "USDT", "100"),
    ("USDT", "PHP", "2"),
    ("USDT", "ETH", "5"),
    ("ETH", "USDT", "0.001"),
    ("USDT", "BTC", "10"),
    ("BTC", "USDT", "0.0001"),
]


class Client:
    """One HTTP/1.1 keep-alive connection, converting for its accounts in turn (each request signed
    with its account's secret): the per-pair quote interval is per account, so a client with two
    accounts may convert up to 16 times a second on the 8 pairs."""

    def __init__(self, port: int, accounts: list[list[str]], offset: int) -> None:
        self.port = port
        self.accounts = [(key, secret.encode()) for _email, key, secret in accounts]
        self.step = offset  # where in PLAN this client starts, so the clients spread over the pairs
        # (account index, PLAN index) -> monotonic time of the last quote answer
        self.last_quote: dict[tuple[int, int], float] = {}
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def post(self, path: str, params: dict[str, str], account: int) -> tuple[int, dict]:
        key, secret = self.accounts[account]
        body = urlencode({**params, "timestamp": time.time_ns() // 1_000_000})
        body += "&signature=" + hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nX-SERVICE-APIKEY: {key}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
        if self.writer is None:
            await self._connect()
        try:
            self.writer.write(request)
            return await self._response()
        except (ConnectionError, asyncio.IncompleteReadError):
            await self.close()
            raise

    async def _response(self) -> tuple[int, dict]:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("closed by the server")
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if chunked:
            data = b""
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                data += chunk[:-2]
        else:
            data = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, json.loads(data) if data else {}


class LockWaits:
    """Samples, every 50 ms in a thread, how many of the bench database's PostgreSQL backends wait
    for a lock (pg_stat_activity.wait_event_type = 'Lock': a row lock held by another transaction).
    Queueing on one hot ledger row shows here directly, whatever the machine's speed. Connected to
    the `postgres` database, so that its own backend is not one of the bench database's."""

    def __init__(self, database_url: str, database: str) -> None:
        self.url, self.database = database_url.rsplit("/", 1)[0] + "/postgres", database
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.05):
                self.samples.append(
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                        (self.database,),
                    ).fetchone()[0]
                )

    def __enter__(self) -> LockWaits:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


class Tally:
    def __init__(self) -> None:
        self.accepted = 0  # SUCCESS accepts answered inside the round's window
        self.accepted_total = 0  # every SUCCESS answer (the warm-up's and the in-flight tail's too)
        self.failures: Counter[str] = Counter()
        self.both_ms: list[float] = []
        self.accept_ms: list[float] = []
        self.throttle_waits = 0


def _failure(endpoint: str, status: int, answer: dict) -> str:
    if "error" in answer:
        return f"{endpoint}: {answer.get('error')} (status {answer.get('status')})"
    return f"{endpoint}: HTTP {status} {answer.get('code')} {answer.get('msg')}"


async def _run_client(client: Client, tally: Tally, window_end: float, interval_s: float) -> None:
    while time.monotonic() < window_end:
        account = client.step % len(client.accounts)
        index = (client.step // len(client.accounts)) % len(PLAN)
        client.step += 1
        source, target, amount = PLAN[index]
        wait = client.last_quote.get((account, index), -1e9) + interval_s - time.monotonic()
        if wait > 0:
            tally.throttle_waits += 1
            await asyncio.sleep(wait)
            if time.monotonic() >= window_end:
                break
        began = time.monotonic()
        try:
            status, answer = await client.post(
                "/openapi/convert/v1/get-quote",
                {"sourceCurrency": source, "targetCurrency": target, "sourceAmount": amount},
                account,
            )
            client.last_quote[(account, index)] = time.monotonic()
            if status != 200 or answer.get("status") != 0:
                tally.failures[_failure("get-quote", status, answer)] += 1
                continue
            quoted = time.monotonic()
            status, answer = await client.post(
                "/openapi/convert/v1/accept-quote", {"quoteId": answer["data"]["quoteId"]}, account
            )
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            tally.failures[f"connection: {type(exc).__name__}"] += 1
            continue
        done = time.monotonic()
        if status == 200 and answer.get("status") == 0 and answer["data"].get("status") == "SUCCESS":
            tally.accepted_total += 1
            if done <= window_end:
                tally.accepted += 1
                tally.both_ms.append((done - began) * 1000)
                tally.accept_ms.append((done - quoted) * 1000)
        else:
            tally.failures[_failure("accept-quote", status, answer)] += 1


def convert_round(clients: list[Client], seconds: float, interval_ms: int) -> dict:
    """Every client in its loop for `seconds`; conversions begun before the end finish (not counted)."""
    tally = Tally()

    async def run() -> None:
        window_end = time.monotonic() + seconds
        await asyncio.gather(*(_run_client(c, tally, window_end, interval_ms / 1000) for c in clients))
        for client in clients:  # the connections belong to this event loop
            await client.close()

    cpu = time.process_time()
    asyncio.run(run())
    cpu = time.process_time() - cpu
    both, accept = sorted(tally.both_ms), sorted(tally.accept_ms)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    return {
        "rps": tally.accepted / seconds,
        "accepted": tally.accepted,
        "accepted_total": tally.accepted_total,
        "failures": tally.failures,
        "throttle_waits": tally.throttle_waits,
        "client_cpu_s": cpu,
        "p50_ms": pct(both, 0.50),
        "p99_ms": pct(both, 0.99),
        "accept_p50_ms": pct(accept, 0.50),
        "accept_p99_ms": pct(accept, 0.99),
    }


def cpu_by_process(server_pid: int, database: str) -> dict[str, dict[int, float]]:
    """CPU seconds (user + system) so far of each process of the server (its process tree), of each
    PostgreSQL backend connected to `database` (not the other work on the machine's PostgreSQL, unlike
    bench/transfers' cpu_seconds) and of Redis (the whole server), by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        found[int(entry.name)] = (title, (int(fields[11]) + int(fields[12])) / tick)
    tree, todo = set(), [server_pid]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    totals: dict[str, dict[int, float]] = {"web": {}, "postgres": {}, "redis": {}}
    for pid, (title, seconds) in found.items():
        if pid in tree:
            totals["web"][pid] = seconds
        elif title.startswith("postgres:") and f" {database} " in title:
            totals["postgres"][pid] = seconds
        elif title.startswith("redis-server") or "/redis-server" in title.split(" ", 1)[0]:
            totals["redis"][pid] = seconds
    return totals


def cpu_used(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
    """CPU seconds between two readings, of the processes alive at the second (one that exited in
    between is left out: never a negative figure)."""
    return {name: sum(s - before[name].get(pid, 0.0) for pid, s in pids.items()) for name, pids in after.items()}
