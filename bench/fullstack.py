"""The stack a user starts, under load: `make run` with DATABASE_URL and REDIS_URL (nginx in front of
granian and Daphne, Celery worker and beat; harness), on a fresh database with the demo
world, driven from outside by this script's own clients (bench/client.py) through nginx's one port.

1. Load: CLIENTS (64) signed keep-alive clients for SECONDS (30), each request with a fresh timestamp
   and signature, USDT transfers between the demo master and peer (both accounts busy: every request
   locks both), half of the clients each way. Printed: transfers/s, p50/p99, every status and error
   code the clients saw, HTTP 5xx (from the clients and from nginx's access log: must be 0), the
   PostgreSQL connections of the stack's database sampled every 0.2 s (must stay <= the stack's
   bound, harness), and the events of 5 websockets on the peer's listenKey (receipt - `u`).
2. One busy account, events: RATE (100) transfers/s master -> peer, sent by 8 clients through nginx
   (so both granian workers commit them and both publish), 5 websockets on the peer's listenKey:
   commit to receipt, p50/p99, from each posting's commit time (PostgreSQL's
   pg_xact_commit_timestamp of the posting row: `make services` turns track_commit_timestamp on;
   without it the target falls back to receipt - `u`, which adds the posting's lock wait), split into
   receipt - `E` (from the websocket server's hub dispatching it); missing and extra events (must be
   0); target p99 < 50 ms. The CPU of each kind of process per phase is printed.
3. The same with 50 websockets on the peer's one listenKey.
Every websocket must receive exactly one outboundAccountPosition per posting that touched the peer
while it listened (counted in the database by the account's change-feed sequence), the last with
the database's balance. The ledger check runs at the end.

Environment: BENCH_CLIENTS, BENCH_SECONDS, BENCH_RATE, BENCH_EVENT_SECONDS, BENCH_PORT.
headline: p99 commit-to-receipt (ms) of phase 2. Exit status 1 when a rule above is broken.
"""

import asyncio
import contextlib
import os
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import psycopg

from bench import _bench
from harness import client
from harness.layout import Layout
from harness.make_run import make_run
from harness.services import demo_keys

CLIENTS = int(os.environ.get("BENCH_CLIENTS", "64"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "30"))
RATE = float(os.environ.get("BENCH_RATE", "100"))
EVENT_SECONDS = float(os.environ.get("BENCH_EVENT_SECONDS", "15"))
EVENT_SENDERS = 8
HOST = "127.0.0.1"


class ConnectionSampler(threading.Thread):
    """The most connections to `dbname` seen in pg_stat_activity, every 0.2 s."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        super().__init__(daemon=True)
        self.admin_url, self.dbname = admin_url, dbname
        self.peak = 0
        self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self.halt.wait(0.2):
                (count,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    [self.dbname],
                ).fetchone()
                self.peak = max(self.peak, count)
                self.samples += 1


class Book:
    """The stack's database as the checks read it."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def user_id(self, email: str) -> int:
        return self.conn.execute("SELECT id FROM accounts_user WHERE email = %s", [email]).fetchone()[0]

    def seq(self, user_id: int) -> int:
        return self.conn.execute("SELECT seq FROM accounts_ledgeraccount WHERE user_id = %s", [user_id]).fetchone()[0]

    def postings_between(self, user_id: int, after: int, upto: int) -> int:
        return self.conn.execute(
            "SELECT count(DISTINCT posting_id) FROM accounts_balancechange WHERE account_id = %s AND seq > %s"
            " AND seq <= %s",
            [user_id, after, upto],
        ).fetchone()[0]

    def commits(self, user_id: int, after: int, upto: int) -> dict[str, float] | None:
        """Each posting's commit time (ms) by the account's free balance after it (unique here: every
        posting of the phase raises or lowers it), from track_commit_timestamp; None when it is off."""
        try:
            rows = self.conn.execute(
                # The posting's row (never updated; the change rows are, when the relay marks them
                # published, which gives them the marking transaction's xmin).
                "SELECT c.free_after, extract(epoch FROM pg_xact_commit_timestamp(p.xmin)) * 1000"
                " FROM accounts_balancechange c JOIN accounts_posting p ON p.id = c.posting_id"
                " WHERE c.account_id = %s AND c.seq > %s AND c.seq <= %s",
                [user_id, after, upto],
            ).fetchall()
        except psycopg.Error:
            return None
        return {str(Decimal(free).normalize()): float(at) for free, at in rows if at is not None} or None

    def free(self, user_id: int, asset: str) -> str:
        row = self.conn.execute(
            "SELECT b.free FROM accounts_balance b JOIN accounts_asset a ON a.id = b.asset_id"
            " WHERE b.account_id = %s AND a.code = %s",
            [user_id, asset],
        ).fetchone()
        return row[0] if row else None


async def listen_key(signer: client.Signer, port: int) -> str:
    conn = client.HttpConnection(HOST, port)
    status, body = await conn.request("POST", "/openapi/v1/userDataStream", {"X-SERVICE-APIKEY": signer.api_key})
    await conn.close()
    assert status == 200, body
    import json

    return json.loads(body)["listenKey"]


async def settle(book: Book, user_id: int, seconds: float = 10.0) -> int:
    """The account's sequence once it has stopped moving (requests in flight committed)."""
    last, since = book.seq(user_id), time.monotonic()
    while time.monotonic() - since < 1.0:
        await asyncio.sleep(0.2)
        now = book.seq(user_id)
        if now != last:
            last, since = now, time.monotonic()
    await asyncio.sleep(1.5)  # delivery of the last ones
    return last


def event_report(
    name: str, listeners: list[client.Listener], expected: int, final_free: str, start_ms: float, commits=None
):
    lags = [received - u for lst in listeners for received, u, _ in lst.positions if received >= start_ms]
    from_commit = [
        received - commits[key]
        for lst in listeners
        for received, _, balances in lst.positions
        if commits and (key := str(Decimal(str(balances.get("USDT"))).normalize())) in commits
    ]
    counts = [len(lst.positions) for lst in listeners]
    missing = sum(max(0, expected - c) for c in counts)
    extra = sum(max(0, c - expected) for c in counts)
    wrong_end = sum(
        1
        for lst in listeners
        if not lst.positions or Decimal(str(lst.positions[-1][2].get("USDT"))) != Decimal(str(final_free))
    )
    closed = sum(1 for lst in listeners if lst.closed_with is not None)
    p50, p99 = client.percentile(lags, 50), client.percentile(lags, 99)
    hub = [lag for lst in listeners for lag in lst.from_hub[-len(lst.positions) :]]
    hub_part = f"; of which hub dispatch (E) to receipt p50 {client.percentile(hub, 50):.1f} ms, p99 " + (
        f"{client.percentile(hub, 99):.1f} ms"
    )
    print(
        f"{name}: {len(listeners)} websockets, {expected} postings each, events received {sum(counts)}, "
        f"missing {missing}, extra {extra}, last balance wrong on {wrong_end}, closed by the server {closed}; "
        f"receipt - u p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(lags) if lags else float('nan'):.1f} ms"
        + (hub_part if hub else "")
    )
    commit_p99 = client.percentile(from_commit, 99)
    if from_commit:
        print(
            f"{name}_commit_to_receipt: p50 {client.percentile(from_commit, 50):.1f} ms, p99 {commit_p99:.1f} ms, "
            f"max {max(from_commit):.1f} ms over {len(from_commit)} events (PostgreSQL's commit timestamps)"
        )
    return {
        "p50": p50,
        "p99": p99,
        "commit_p99": commit_p99 if from_commit else None,
        "missing": missing,
        "extra": extra,
        "wrong_end": wrong_end,
        "closed": closed,
    }


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    for kind in ("daphne", "granian", "nginx", "celery"):
        if kind in cmd:
            return kind
    return "other"


class CpuMeter:
    """CPU seconds per kind of the stack's processes (the make-run tree), of this bench process and of
    the stack database's PostgreSQL backends between `start` and `stop`, as percent of one core."""

    def __init__(self, root: int, admin_url: str, dbname: str) -> None:
        self.root, self.admin_url, self.dbname = root, admin_url, dbname

    def _snapshot(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo += _children(pid)
            kind = _kind(pid)
            totals[kind] = totals.get(kind, 0.0) + _cpu_seconds(pid)
        totals["bench client"] = _cpu_seconds(os.getpid())
        with contextlib.suppress(Exception), psycopg.connect(self.admin_url, autocommit=True) as conn:
            pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.dbname])]
            totals["postgres"] = sum(_cpu_seconds(p) for p in pids)
        return totals

    def start(self) -> None:
        self.began, self.at = self._snapshot(), time.monotonic()

    def stop(self) -> str:
        end, seconds = self._snapshot(), time.monotonic() - self.at
        parts = [
            f"{kind} {100 * (end[kind] - self.began.get(kind, 0.0)) / seconds:.0f}%"
            for kind in ("daphne", "granian", "nginx", "celery", "postgres", "bench client")
            if kind in end
        ]
        return "cpu (% of one core): " + ", ".join(parts)


def nginx_5xx(run_dir: Path) -> int:
    log = run_dir / "access.log"
    if not log.exists():
        return 0
    count = 0
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split('"')
        if len(parts) > 2:
            status = parts[2].split()[0]
            if status.startswith("5"):
                count += 1
    return count


async def load_phase(running, keys, book, ids, meter: CpuMeter) -> dict:
    master = client.Signer(keys["master"]["api_key"], keys["master"]["secret_key"])
    peer = client.Signer(keys["peer"]["api_key"], keys["peer"]["secret_key"])
    key = await listen_key(peer, running.port)
    listeners = [client.Listener(f"ws://{HOST}:{running.port}/openapi/ws/{key}") for _ in range(5)]
    for lst in listeners:
        await lst.start()
    await asyncio.sleep(0.5)
    seq0 = book.seq(ids["peer"])
    tally = client.Tally()
    start_ms = time.time() * 1000
    started = time.monotonic()
    until = started + SECONDS

    def params_to(email):
        return lambda n: {"account": "USDT", "target_address": email, "amount": "0.01"}

    meter.start()
    tasks = []
    for i in range(CLIENTS):
        signer, target = (master, keys["peer"]["email"]) if i % 2 == 0 else (peer, keys["master"]["email"])
        tasks.append(client.signed_loop(HOST, running.port, signer, params_to(target), tally, until))
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    cpu = meter.stop()
    seq1 = await settle(book, ids["peer"])
    expected = book.postings_between(ids["peer"], seq0, seq1)
    events = event_report("load_events", listeners, expected, book.free(ids["peer"], "USDT"), start_ms)
    for lst in listeners:
        await lst.stop()
    ok = tally.statuses.get(200, 0)
    print(
        f"load: {CLIENTS} clients, {elapsed:.1f} s: transfers {ok / elapsed:.0f}/s, "
        f"p50 {client.percentile(tally.latencies, 50):.0f} ms, p99 {client.percentile(tally.latencies, 99):.0f} ms; "
        f"{tally.summary()}"
    )
    print(f"load_{cpu}")
    return {"tally": tally, "rate": ok / elapsed, "events": events}


async def events_phase(running, keys, book, ids, websockets: int, name: str, meter: CpuMeter) -> dict:
    master = client.Signer(keys["master"]["api_key"], keys["master"]["secret_key"])
    peer = client.Signer(keys["peer"]["api_key"], keys["peer"]["secret_key"])
    key = await listen_key(peer, running.port)
    listeners = [client.Listener(f"ws://{HOST}:{running.port}/openapi/ws/{key}") for _ in range(websockets)]
    for lst in listeners:
        await lst.start()
    await asyncio.sleep(0.5)
    seq0 = book.seq(ids["peer"])
    tally = client.Tally()
    start_ms = time.time() * 1000
    until = time.monotonic() + EVENT_SECONDS
    pace = EVENT_SENDERS / RATE
    meter.start()
    await asyncio.gather(
        *[
            client.signed_loop(
                HOST,
                running.port,
                master,
                lambda n: {"account": "USDT", "target_address": keys["peer"]["email"], "amount": "0.01"},
                tally,
                until,
                pace=pace,
            )
            for _ in range(EVENT_SENDERS)
        ]
    )
    cpu = meter.stop()
    seq1 = await settle(book, ids["peer"])
    expected = book.postings_between(ids["peer"], seq0, seq1)
    commits = book.commits(ids["peer"], seq0, seq1)
    report = event_report(name, listeners, expected, book.free(ids["peer"], "USDT"), start_ms, commits)
    print(f"{name}_senders: {tally.statuses.get(200, 0) / EVENT_SECONDS:.0f} transfers/s; {tally.summary()}")
    print(f"{name}_{cpu}")
    for lst in listeners:
        await lst.stop()
    report["tally"] = tally
    return report


async def run(running) -> int:
    env = running.env
    keys = demo_keys(env)
    book = Book(env["DATABASE_URL"])
    ids = {role: book.user_id(keys[role]["email"]) for role in ("master", "peer")}
    layout = Layout.from_env(env, port=running.port, run_dir=running.run_dir)
    admin_url = env["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    sampler = ConnectionSampler(admin_url, env["DATABASE_URL"].rsplit("/", 1)[1])
    sampler.start()
    meter = CpuMeter(running.pid, admin_url, env["DATABASE_URL"].rsplit("/", 1)[1])
    load = await load_phase(running, keys, book, ids, meter)
    busy = await events_phase(running, keys, book, ids, 5, "busy_account", meter)
    fan = await events_phase(running, keys, book, ids, 50, "one_listenkey_50", meter)
    sampler.halt.set()
    sampler.join()
    time.sleep(2.5)  # nginx flushes its buffered access log every 2 s
    from_nginx = nginx_5xx(running.run_dir)
    budget = layout.connection_budget()
    print(f"postgres_connections: peak {sampler.peak} over {sampler.samples} samples; the stack's bound {budget}")
    from_clients = load["tally"].server_errors + busy["tally"].server_errors + fan["tally"].server_errors
    print(f"http_5xx: clients {from_clients}, nginx access log {from_nginx}")
    check = _bench.manage(env, "ledger_check")
    print("ledger_check:", check.strip().splitlines()[-1] if check.strip() else "ok")
    problems = []
    if from_nginx or from_clients:
        problems.append("HTTP 5xx answers")
    if sampler.peak > budget:
        problems.append(f"{sampler.peak} PostgreSQL connections, over the bound {budget}")
    for name, rep in (("load", load["events"]), ("busy_account", busy), ("one_listenkey_50", fan)):
        if rep["missing"] or rep["extra"] or rep["wrong_end"]:
            problems.append(f"{name}: events missing/extra/out of order")
    # The target is commit to receipt; without commit timestamps, receipt - u (which adds the lock wait).
    busy_p99 = busy["commit_p99"] if busy["commit_p99"] is not None else busy["p99"]
    if busy_p99 >= 50:
        problems.append(f"busy account p99 {busy_p99:.0f} ms >= 50 ms")
    print(f"headline: {busy_p99:.1f}")
    for problem in problems:
        print("PROBLEM:", problem)
    return 1 if problems else 0


def main() -> int:
    env = _bench.bench_env(
        "exchange_bench_fullstack",
        4,
        IP_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        UID_WEIGHT_LIMIT_PER_MINUTE="1000000000",
    )
    env.pop("RATE_LIMIT_STORAGE_URL", None)
    port = int(os.environ["BENCH_PORT"]) if os.environ.get("BENCH_PORT") else None
    print(f"clients: {CLIENTS} for {SECONDS:.0f} s; events at {RATE:.0f}/s for {EVENT_SECONDS:.0f} s")
    print(f"cores: {os.cpu_count()}")
    with make_run(env, port) as running:
        layout = Layout.from_env(env, port=running.port, run_dir=running.run_dir)
        print(
            f"stack: make run on 127.0.0.1:{running.port}: nginx, "
            f"granian {layout.rest_workers} x {layout.rest_threads}, "
            f"Daphne x {len(layout.ws_ports)}, Celery worker ({layout.celery_concurrency}) and beat"
        )
        return asyncio.run(run(running))


if __name__ == "__main__":
    sys.exit(main())
