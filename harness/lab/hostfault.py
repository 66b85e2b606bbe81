"""An application host lost, on the lab (docs/scaling.md): app1 and app2 behind HAProxy
(harness/lab/apphosts.py), app1 holding RedBeat's lock; signed transfers from peer to master,
websockets on master's listenKey through HAProxy; SIGKILL to every process of app1. The figures:
seconds until the other host's beat runs a periodic task (the simulated chain's block, every second:
RedBeat's run count of the entry in Redis, so a period run twice shows), the websockets of
app1 reconnected through HAProxy and resynced (REST balance, then the stream: every event once, in
order: each position is the last one plus the 0.01 received), every transfer answered and once in the
database (the one in flight on app1 when it died is sent again by its client, same client id, new
signature, until answered: 200, or 400 -1010 duplicate when the first attempt was made),
`ledger_check`. Then transfers/s with both hosts and with one.

    python -m harness.lab hostfault [--before 10] [--after 30] [--bench 20] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

import psycopg
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from harness import client
from harness.chaos.records import TRANSFER, TRANSFER_QUERY, send
from harness.lab import apphosts, cluster, topology
from harness.lab.fault import fresh, redis_client
from harness.ports import HOST, free_block
from harness.private import stack_environment
from harness.services import manage, python

REDIS_DB = 2
STEP = Decimal("0.01")
BENCH_ACCOUNTS = 16


class Heights:
    """The beat's runs of `sim-chain-blocks` (every second), read every 0.1 s from RedBeat's own record
    of the entry in Redis (`total_run_count` in its meta, written by the beat that sends it): a count
    that moves by 2 between reads, or two runs within half a period, is a period run twice."""

    KEY = "redbeat:sim-chain-blocks"

    def __init__(self, redis_client) -> None:
        self.redis = redis_client
        self.changes: list[tuple[float, int]] = []  # (monotonic, runs)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import redis

        last = None
        while not self.stop.is_set():
            with contextlib.suppress(redis.RedisError, ValueError, TypeError):
                meta = self.redis.hget(self.KEY, "meta")
                runs = int(json.loads(meta)["total_run_count"]) if meta else 0
                if runs != last:
                    self.changes.append((time.monotonic(), runs))
                    last = runs
            time.sleep(0.1)

    def intervals(self) -> list[float]:
        """Seconds between runs (the first reading is the count when the watch began, not a run)."""
        return [b[0] - a[0] for a, b in itertools.pairwise(self.changes[1:])]

    def doubled(self) -> int:
        """Periods run twice: the count moving by 2 between reads, or two runs within half a period."""
        steps = [b[1] - a[1] for a, b in itertools.pairwise(self.changes)]
        return sum(1 for s in steps if s > 1) + sum(1 for g in self.intervals() if g < 0.5)


@dataclass
class Socket:
    """One websocket client through HAProxy on master's listenKey, reconnecting when it is closed,
    resyncing from the REST balance; every connection's USDT positions in order."""

    url: str
    resync: object  # async () -> Decimal
    connections: list[dict] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                ws = await connect(self.url, open_timeout=10)
            except (OSError, InvalidHandshake, TimeoutError):
                await asyncio.sleep(0.2)
                continue
            conn = {"opened": time.monotonic(), "resync": None, "positions": [], "closed": None}
            self.connections.append(conn)
            conn["resync"] = await self.resync()  # after the connection: no posting falls between
            try:
                while not self.stop.is_set():
                    try:
                        raw = await asyncio.wait_for(ws.recv(), 0.5)
                    except TimeoutError:
                        continue
                    event = json.loads(raw)
                    if event.get("e") == "outboundAccountPosition":
                        free = next((Decimal(b["f"]) for b in event["B"] if b["a"] == "USDT"), None)
                        if free is not None:
                            conn["positions"].append(free)
            except ConnectionClosed:
                conn["closed"] = time.monotonic()
                continue
            await ws.close()


def judge_socket(sock: Socket, final: Decimal) -> tuple[bool, str]:
    """Within a connection each position is the last plus 0.01 (once, in order); after a reconnect
    the first position is at most one step past the REST resync (nothing missed between them);
    positions at or under the resync are ones the client knew already (counted, not new)."""
    ok, known, events, gaps = True, 0, 0, []
    for conn in sock.connections:
        seq = conn["positions"]
        events += len(seq)
        for a, b in itertools.pairwise(seq):
            if b - a != STEP:
                ok = False
                gaps.append(f"{a}->{b}")
        if conn["resync"] is not None and seq:
            if seq[0] > conn["resync"] + STEP:
                ok = False
                gaps.append(f"resync {conn['resync']} then {seq[0]}")
            known += sum(1 for v in seq if v <= conn["resync"])
    last = next((c["positions"][-1] for c in reversed(sock.connections) if c["positions"]), None)
    if last != final:
        ok = False
    reconnects = len(sock.connections) - 1
    gap_text = f", breaks {gaps[:3]}" if gaps else ""
    return ok, (
        f"{len(sock.connections)} connection(s) ({reconnects} reconnect), {events} positions, {known} already "
        f"known from the resync, last {last} vs balance {final}{gap_text}"
    )


async def usdt_free(signer: client.Signer, port: int) -> Decimal:
    conn = client.HttpConnection(HOST, port)
    try:
        for _ in range(50):
            status, body, _ = await send(conn, "GET", f"/openapi/v1/account?{signer.signed({})}", signer.api_key)
            if status == 200:
                return next(Decimal(b["free"]) for b in json.loads(body)["balances"] if b["asset"] == "USDT")
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    raise RuntimeError("no balance from /openapi/v1/account")


async def listen_key(api_key: str, port: int) -> str:
    conn = client.HttpConnection(HOST, port)
    try:
        status, body = await conn.request("POST", "/openapi/v1/userDataStream", {"X-SERVICE-APIKEY": api_key})
    finally:
        await conn.close()
    if status != 200:
        raise RuntimeError(f"userDataStream: {status} {body[:200]!r}")
    return json.loads(body)["listenKey"]


# How long a client tries one transfer again (a new timestamp and signature, the same client id)
# before it gives up and the run counts it unanswered.
RETRY_SECONDS = 60.0
DUPLICATE = -1010  # wallet.errors.DuplicateClientTransferId: the client id was used (by an earlier attempt)


@dataclass
class Sent:
    """One transfer as its client saw it: the last attempt's answer, the first's, how many attempts."""

    ident: str
    status: int | None
    code: int | None = None
    ref: str | None = None  # the transfer's id: answered 200, or (a duplicate) found by its client id
    first: int | None = None
    attempts: int = 1


async def pay(port, signer, target, counter, sent, stop) -> None:
    """Transfers of 0.01 USDT, each with its client id; one without an answer (the connection reset,
    the host gone) or with a 5xx is sent again, signed anew, through HAProxy until it is answered:
    200 (made by this attempt) or 400 -1010 duplicate (made by an earlier one: its id asked for)."""
    conn = client.HttpConnection(HOST, port)
    try:
        while not stop.is_set():
            ident = f"lab-h{next(counter)}"
            params = {"account": "USDT", "target_address": target, "amount": "0.01", "client_transfer_id": ident}
            record = Sent(ident, None)
            deadline = time.monotonic() + RETRY_SECONDS
            while True:
                status, body, _ = await send(conn, "POST", f"{TRANSFER}?{signer.signed(params)}", signer.api_key)
                if record.attempts == 1:
                    record.first = status
                data = {}
                with contextlib.suppress(ValueError):
                    data = json.loads(body) if body else {}
                record.status, record.code = status, data.get("code") if isinstance(data, dict) else None
                if status == 200:
                    record.ref = str(data.get("transfer", {}).get("id"))
                if (status is not None and status < 500) or time.monotonic() > deadline:
                    break
                record.attempts += 1
                await asyncio.sleep(0.2)
            if record.attempts > 1 and record.status == 400 and record.code == DUPLICATE:
                record.ref = await transfer_by_client_id(port, signer, ident)
            sent.append(record)
            await asyncio.sleep(0.05 if record.status != 200 else 0.02)
    finally:
        await conn.close()


async def transfer_by_client_id(port, signer, ident: str) -> str | None:
    """The sender's transfer with client id `ident` (GET .../transfers?client_transfer_id=), its id."""
    conn = client.HttpConnection(HOST, port)
    try:
        for _ in range(50):
            query = signer.signed({"client_transfer_id": ident})
            status, body, _ = await send(conn, "GET", f"{TRANSFER_QUERY}?{query}", signer.api_key)
            if status == 200:
                found = json.loads(body).get("transfers", [])
                return str(found[0]["id"]) if found else None
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    return None


async def fault_run(sup, port, world, say, before: float, after: float) -> dict:
    master = client.Signer(world["master"]["api_key"], world["master"]["secret_key"])
    peer = client.Signer(world["peer"]["api_key"], world["peer"]["secret_key"])
    key = await listen_key(master.api_key, port)

    async def resync() -> Decimal:
        return await usdt_free(client.Signer(master.api_key, master.secret), port)

    sockets = [Socket(f"ws://{HOST}:{port}/openapi/ws/{key}", resync) for _ in range(4)]
    tasks = [asyncio.create_task(s.run()) for s in sockets]
    await asyncio.sleep(2)
    sent: list = []
    stop = asyncio.Event()
    counter = itertools.count()
    payers = [asyncio.create_task(pay(port, peer, world["master"]["email"], counter, sent, stop)) for _ in range(2)]
    await asyncio.sleep(before)
    victim = topology.APP_HOSTS[0]
    killed_at = time.monotonic()
    count = apphosts.kill_host(sup, victim)
    say(f"SIGKILL to every process on {victim.name} ({victim.address}, RedBeat's holder): {count} processes")
    await asyncio.sleep(after)
    stop.set()
    await asyncio.gather(*payers)
    await asyncio.sleep(3)  # the last postings reach the websockets
    final = await resync()
    for s in sockets:
        s.stop.set()
    await asyncio.gather(*tasks)
    return {"sent": sent, "killed_at": killed_at, "sockets": sockets, "final": final}


async def bench(port, accounts, clients: int, seconds: float) -> tuple[float, client.Tally]:
    tally = client.Tally()
    until = time.monotonic() + seconds
    loops = []
    for i in range(clients):
        sender, target = accounts[2 * i % len(accounts)], accounts[(2 * i + 1) % len(accounts)]
        signer = client.Signer(sender[1], sender[2])

        def params(n, target=target[0]):
            return {"account": "PHP", "target_address": target, "amount": "1"}

        loops.append(client.signed_loop(HOST, port, signer, params, tally, until))
    began = time.monotonic()
    await asyncio.gather(*loops)
    return tally.statuses[200] / (time.monotonic() - began), tally


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.lab hostfault")
    parser.add_argument("--before", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=30.0)
    parser.add_argument("--bench", type=float, default=20.0, help="seconds of each throughput run (0: none)")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    t0 = time.monotonic()

    def say(text: str) -> None:
        sys.stdout.write(f"[lab +{time.monotonic() - t0:6.1f}s] {text}\n")
        sys.stdout.flush()

    if cluster.pg_leader() is None:
        raise SystemExit("the lab is not up: python -m harness.lab up")
    port = free_block(1)
    app = topology.app_env(REDIS_DB)
    env = apphosts.app_env(stack_environment(app["DATABASE_URL"], app["REDIS_URL"], port, apphosts.RUN_DIR) | app)
    fresh(REDIS_DB)
    manage(env, "migrate", "--noinput", "-v", "0")
    world = json.loads(manage(env, "demo", "--json").stdout.strip().splitlines()[-1])
    made = python(env, "-m", "harness.lab.bench_accounts", str(BENCH_ACCOUNTS))  # funded, pairs share no lock
    accounts = json.loads(made.stdout.strip().splitlines()[-1])
    sup = apphosts.supervisor(env, port)
    sup.start()
    ok = True
    heights = Heights(redis_client(REDIS_DB))
    try:
        apphosts.wait_ready(topology.APP_HOSTS, port)
        apphosts.start_beats(sup, redis_client(REDIS_DB))
        say(f"app1, app2 and HAProxy on {HOST}:{port}; beat-app1 holds RedBeat's lock; {cluster.status()}")
        heights.thread.start()
        run = asyncio.run(fault_run(sup, port, world, say, args.before, args.after))
        heights.stop.set()
        killed_at = run["killed_at"]
        ok = report_beat(heights, killed_at, say) and ok
        for i, sock in enumerate(run["sockets"]):
            good, text = judge_socket(sock, run["final"])
            say(f"websocket {i + 1}: {'OK' if good else 'FAIL'}: {text}")
            ok = ok and good
        ok = report_transfers(run["sent"], env, say) and ok
        done = manage(env, "ledger_check", check=False)
        say(f"ledger_check: exit {done.returncode}: {(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        ok = ok and done.returncode == 0
        if args.bench:
            for name in ("rest", "ws", "worker"):
                sup.rpc().startProcess(f"{name}-{topology.APP_HOSTS[0].name}", True)
            apphosts.wait_ready(topology.APP_HOSTS, port)
            time.sleep(3)  # HAProxy's checks see app1 up again (rise 2)
            for label, hosts in (("two app hosts", 2), ("one app host", 1)):
                if hosts == 1:
                    sup.rpc().stopProcess(f"rest-{topology.APP_HOSTS[1].name}", True)
                    time.sleep(3)  # marked down (fall 2)
                rate, tally = asyncio.run(bench(port, accounts, args.clients, args.bench))
                say(f"{label}: {rate:.0f} transfers/s ({args.clients} clients, {args.bench:.0f} s): {tally.summary()}")
    finally:
        heights.stop.set()
        sup.stop()
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


def report_beat(heights: Heights, killed_at: float, say) -> bool:
    changes = heights.changes
    before = [(t, h) for t, h in changes if t < killed_at]
    after = [(t, h) for t, h in changes if t >= killed_at]
    doubled = heights.doubled()
    if not after:
        say("beat: NO periodic task ran after the kill")
        return False
    last = before[-1][0] - killed_at if before else float("nan")
    say(
        f"beat: last run by app1 {last:+.1f} s before the kill, first by app2 +{after[0][0] - killed_at:.1f} s after "
        f"(RedBeat's lock timeout 10 s + a 1 s poll); {len(changes) - 1} runs of the 1 s block task, "
        f"shortest interval {min(heights.intervals(), default=0.0):.2f} s, periods run twice: {doubled}"
    )
    return doubled == 0


def judge_transfers(sent: list[Sent], book: dict[str, list[str]]) -> list[str]:
    """What breaks "every transfer answered, and exactly once in the database": `book` is client id ->
    the transfers' ids in the database. A 200 is its own id, once; a retry's 400 -1010 duplicate is one
    transfer made by an earlier attempt (the id its client found); any other 4xx made nothing;
    no answer (or a 5xx) at the end is a transfer left unanswered."""
    bad = []
    for s in sent:
        rows = book.get(s.ident, [])
        if s.status is None or s.status >= 500:
            bad.append(f"{s.ident}: unanswered after {s.attempts} attempt(s) ({s.status}), in the database {rows}")
        elif s.status == 200 and rows != [s.ref]:
            bad.append(f"{s.ident}: 200 with id {s.ref}, in the database {rows}")
        elif s.status == 400 and s.code == DUPLICATE and s.attempts > 1:
            if len(rows) != 1 or rows != [s.ref]:
                bad.append(f"{s.ident}: duplicate on attempt {s.attempts} (found {s.ref}), in the database {rows}")
        elif s.status != 200 and rows:
            bad.append(f"{s.ident}: refused {s.status}/{s.code}, yet in the database {rows}")
    return bad


def report_transfers(sent: list[Sent], env: dict[str, str], say) -> bool:
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        rows = conn.execute(
            "SELECT client_transfer_id, id FROM wallet_transfer WHERE client_transfer_id LIKE %s", ["lab-h%"]
        ).fetchall()
    book: dict[str, list[str]] = {}
    for ident, pk in rows:
        book.setdefault(ident, []).append(str(pk))
    statuses = Counter(s.status for s in sent)
    firsts = Counter(s.first for s in sent)
    retried = [s for s in sent if s.attempts > 1]
    bad = judge_transfers(sent, book)
    say(
        f"{len(sent)} transfers through HAProxy: first answers {dict(firsts)}, final answers {dict(statuses)}; "
        f"{len(retried)} sent again with the same client id: "
        + (
            ", ".join(f"{s.ident} {s.attempts} attempts -> {s.status}/{s.code} id {s.ref}" for s in retried[:5])
            or "none"
        )
        + f"; every transfer answered and once in the database: {not bad}"
    )
    if bad:
        say(f"not once: {bad[:5]}")
    return not bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
