"""Sub-accounts on the full stack: universal transfers against bench/transfers' transfers in the same
run, and fund collections over 30 sub-accounts.

1. universal_per_s: signed POST /openapi/v1/sub-account/transfer/universal-transfer per second,
   CLIENTS (BENCH_CONNECTIONS, 32) wrk connections cycling through pre-signed requests (as
   bench/transfers: each line signed with its own timestamp, the service refusing a replayed
   signature). Each of the first CLIENTS of bench/transfers' accounts is a master with two virtual
   sub-accounts; its requests go round master -> sub1, sub1 -> sub2, sub2 -> master (1 PHP, no
   clientTranId: the service makes one). Only HTTP 200 with result true counts.
2. transfers_per_s: bench/transfers' load (its code, imported: its accounts, pre-signed bodies,
   wrk with the same connections) on the same server, one round before each universal round, so
   each ratio's two sides see the machine in the same state.
3. collect_s: one master with 30 virtual sub-accounts holding 4 assets each (BTC, ETH, USDT, PHP):
   from the signed collect call (POST /openapi/v1/fund-collect/collect-from-sub-account) until
   get-fund-record shows the task SUCCESS (polled every 10 ms), COLLECT_ROUNDS (3) times, the
   sub-accounts funded again between rounds. The task runs on the full stack's Celery worker.

The stack: exactly as `make run` starts it with DATABASE_URL and REDIS_URL (bench/make_run:
nginx in front of granian and Daphne, the Celery worker and beat), requests through nginx. Fresh
database `exchange_bench_subaccounts`, Redis db 8.

After the run: every 200 universal transfer with result true left one success row and one
VIRTUAL_DISTRIBUTE posting, each collection moved every sub-account's balances to the master, and
the ledger check passes.

headline: universal_per_s / transfers_per_s, the means over the rounds (target >= 0.8); the
collection's figure is printed as collect_s (target < 1 s).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import subprocess
import sys
import time
from urllib.parse import urlencode

from bench import _bench, transfers
from harness.layout import ROOT
from harness.make_run import make_run, stack_label

CLIENTS = transfers.CONNECTIONS
SECONDS = transfers.SECONDS
ROUNDS = transfers.ROUNDS
WARMUP_SECONDS = 3
COLLECT_ROUNDS = int(os.environ.get("BENCH_COLLECT_ROUNDS", "3"))
COLLECT_SUBS = 30
COLLECT_FUNDS = {"BTC": "0.01", "ETH": "0.1", "USDT": "10", "PHP": "100"}
DB_NAME = "exchange_bench_subaccounts"
REDIS_DB = 8
UNIVERSAL = "/openapi/v1/sub-account/transfer/universal-transfer"
COLLECT = "/openapi/v1/fund-collect/collect-from-sub-account"
RECORDS = "/openapi/v1/fund-collect/get-fund-record"
COLLECTOR = "collector@subaccounts.bench"


def universal_bodies(accounts: list[list[str]], families: list[list[str]], count: int = 20000) -> list[str]:
    """`count` lines `api_key body` for wrk: each master's requests go round master -> sub1,
    sub1 -> sub2, sub2 -> master; masters interleaved; each body signed with its own timestamp."""
    stamp = int(time.time() * 1000)
    lines, n = [], 0
    while len(lines) < count:
        for step in range(3):
            for (_, key, secret), (sub1, sub2) in zip(accounts, families, strict=True):
                sides = [{"toEmail": sub1}, {"fromEmail": sub1, "toEmail": sub2}, {"fromEmail": sub2}][step]
                body = urlencode({**sides, "asset": "PHP", "amount": "1", "recvWindow": 60000, "timestamp": stamp - n})
                n += 1
                signature = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
                lines.append(f"{key} {body}&signature={signature}")
    return lines[:count]


class Signed:
    """One keep-alive connection signing each request (query string, as the official connector)."""

    def __init__(self, port: int, key: str, secret: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.key, self.secret = key, secret.encode()

    def call(self, method: str, path: str, params: dict[str, str]) -> tuple[int, object]:
        query = urlencode({**params, "timestamp": time.time_ns() // 1_000_000})
        query += "&signature=" + hmac.new(self.secret, query.encode(), hashlib.sha256).hexdigest()
        self.conn.request(method, f"{path}?{query}", headers={"X-SERVICE-APIKEY": self.key})
        response = self.conn.getresponse()
        return response.status, json.loads(response.read() or b"null")


def collect_round(client: Signed, request_id: str) -> dict:
    began = time.perf_counter()
    status, answer = client.call("POST", COLLECT, {"clientRequestId": request_id})
    if status != 200:
        raise SystemExit(f"collect refused: HTTP {status} {answer}")
    created = answer["status"]
    while True:
        status, records = client.call("GET", RECORDS, {"clientRequestId": request_id})
        state = records[0]["status"] if status == 200 and records else None
        if state in ("SUCCESS", "PARTIAL_SUCCESS", "FAILED"):
            return {"seconds": time.perf_counter() - began, "status": state, "created": created}
        if time.perf_counter() - began > 60:
            raise SystemExit(f"collection {request_id} not finished after 60 s: {records}")
        time.sleep(0.01)


def main() -> None:
    import psycopg

    env = _bench.bench_env(
        DB_NAME, REDIS_DB, IP_WEIGHT_LIMIT_PER_MINUTE="1000000000", UID_WEIGHT_LIMIT_PER_MINUTE="1000000000"
    )
    env.pop("RATE_LIMIT_STORAGE_URL", None)
    env.pop("CELERY_BROKER_URL", None)  # the bench's Redis db
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    t_runs, u_runs, collections = [], [], []
    # The stack exactly as `make run` starts it (fresh database, migrate, the demo world: the assets
    # and the default limit tier; nginx, granian, Daphne, Celery worker and beat), requests through nginx.
    with make_run(env) as running:
        made = subprocess.run(
            [_bench.PYTHON, "-m", "bench.programs.transfer_accounts", str(transfers.ACCOUNTS), transfers.DOMAIN],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        accounts = json.loads(made.stdout.strip().splitlines()[-1])
        masters = accounts[:CLIENTS]
        made = subprocess.run(
            [
                _bench.PYTHON,
                "-m",
                "bench.programs.subaccount_families",
                transfers.DOMAIN,
                str(CLIENTS),
                str(COLLECT_SUBS),
                COLLECTOR,
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        setup = json.loads(made.stdout.strip().splitlines()[-1])
        families, collector = setup["families"], setup["collector"]
        setup_s = time.perf_counter() - t0
        db = psycopg.connect(env["DATABASE_URL"], autocommit=True)

        def one(sql: str, *args):
            return db.execute(sql, args).fetchone()[0]

        def rows() -> int:
            return one("SELECT count(*) FROM wallet_transfer") + one(
                "SELECT count(*) FROM subaccounts_subaccounttransfer"
            )

        def drain() -> None:
            """wrk stops without waiting for in-flight responses: let the server finish them."""
            count, deadline = rows(), time.monotonic() + 15
            while time.monotonic() < deadline:
                time.sleep(0.5)
                now = rows()
                if now == count:
                    break
                count = now

        port = running.port
        transfers.wrk_post(port, transfers.signed_bodies(accounts), WARMUP_SECONDS)
        transfers.wrk_post(port, universal_bodies(masters, families), WARMUP_SECONDS, UNIVERSAL)
        drain()
        for _ in range(ROUNDS):
            t_runs.append(transfers.wrk_post(port, transfers.signed_bodies(accounts), SECONDS))
            drain()
            u_runs.append(transfers.wrk_post(port, universal_bodies(masters, families), SECONDS, UNIVERSAL))
            drain()
        client = Signed(port, collector[1], collector[2])
        for n in range(COLLECT_ROUNDS):
            subprocess.run(
                [
                    _bench.PYTHON,
                    "-m",
                    "bench.programs.subaccount_refill",
                    transfers.DOMAIN,
                    str(n),
                    json.dumps(COLLECT_FUNDS),
                ],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            collections.append(collect_round(client, f"bench-collect-{n}"))
    load_after = os.getloadavg()[0]

    check = subprocess.run(
        [_bench.PYTHON, "manage.py", "ledger_check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    success_rows = one("SELECT count(*) FROM subaccounts_subaccounttransfer WHERE status = 'success'")
    failed_rows = one("SELECT count(*) FROM subaccounts_subaccounttransfer WHERE status = 'failed'")
    universal_postings = one("SELECT count(*) FROM accounts_posting WHERE reference LIKE 'subaccount-transfer:%%'")
    collect_postings = one("SELECT count(*) FROM accounts_posting WHERE reference LIKE 'fund-collect:%%'")
    left_in_subs = one(
        "SELECT coalesce(sum(b.free + b.locked), 0) FROM accounts_balance b JOIN accounts_user u ON u.id = b.account_id"
        " WHERE u.master_id = (SELECT id FROM accounts_user WHERE email = %s)",
        COLLECTOR,
    )
    db.close()

    t_rate = sum(r["rps"] for r in t_runs) / len(t_runs)
    u_rate = sum(r["rps"] for r in u_runs) / len(u_runs)
    u_errors = sum(r["non200"] + r["socket_errors"] for r in u_runs)
    t_errors = sum(r["non200"] + r["socket_errors"] for r in t_runs)
    mid = len(u_runs) // 2
    seconds = sorted(c["seconds"] for c in collections)
    print(f"server: {stack_label(running)}")
    print(
        f"setup: bench/transfers' {transfers.ACCOUNTS} accounts; the first {CLIENTS} are masters with 2 virtual"
        f" sub-accounts each (100000 PHP each); a collector master with {COLLECT_SUBS} virtual sub-accounts;"
        f" in {setup_s:.1f}s incl. migrate"
    )
    print(
        f"load: wrk {CLIENTS} connections, {SECONDS}s x {ROUNDS} rounds each, a transfers round before each universal"
        " round; universal: master -> sub1 -> sub2 -> master, 1 PHP"
    )
    print(f"transfers_per_s: {t_rate:.0f}")
    print(f"universal_per_s: {u_rate:.0f}")
    print(f"universal_p50_ms: {sorted(r['p50_ms'] for r in u_runs)[mid]:.2f}")
    print(f"universal_p99_ms: {max(r['p99_ms'] for r in u_runs):.2f}")
    print(f"transfer_p50_ms: {sorted(r['p50_ms'] for r in t_runs)[mid]:.2f}")
    print(f"transfer_p99_ms: {max(r['p99_ms'] for r in t_runs):.2f}")
    print(
        "rounds (universal/s / transfers/s): "
        + ", ".join(
            f"{u['rps']:.0f} / {t['rps']:.0f} = {u['rps'] / t['rps']:.2f}" for t, u in zip(t_runs, u_runs, strict=True)
        )
    )
    print(f"universal_rows: {success_rows} success, {failed_rows} failed; their postings {universal_postings}")
    print(
        f"collect_s: median {seconds[len(seconds) // 2]:.3f}, max {seconds[-1]:.3f} ({COLLECT_SUBS} sub-accounts x"
        f" {len(COLLECT_FUNDS)} assets, from the collect call to SUCCESS in get-fund-record;"
        f" {', '.join(c['status'] for c in collections)})"
    )
    print(f"left_in_collected_sub_accounts: {left_in_subs}; collection postings {collect_postings}")
    print(f"ledger_check_ok: {check.returncode == 0}")
    print(f"load_average_1m: {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} cores")
    print(f"headline: {u_rate / t_rate:.2f}")
    problems = []
    if u_errors or t_errors:
        problems.append(f"{u_errors} universal and {t_errors} transfer requests failed")
    if failed_rows:
        problems.append(f"{failed_rows} universal transfers recorded as failed")
    if success_rows != universal_postings:
        problems.append(f"{success_rows} successful universal transfers but {universal_postings} postings")
    if collect_postings != COLLECT_ROUNDS * COLLECT_SUBS:
        problems.append(f"{collect_postings} collection postings, not one per sub-account and round")
    if any(c["status"] != "SUCCESS" for c in collections) or left_in_subs != 0:
        problems.append(f"collections {[c['status'] for c in collections]}, {left_in_subs} left in the sub-accounts")
    if check.returncode != 0:
        problems.append("the ledger check failed:\n" + check.stdout + check.stderr)
    if problems:
        sys.exit("; ".join(problems) + "; the figures are not valid")


if __name__ == "__main__":
    main()
