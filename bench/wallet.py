"""Withdrawals on the full stack: the REST server (granian's WSGI interface as in production, or
BENCH_SERVER=gunicorn; see _bench.rest_server) + PostgreSQL + Redis (broker and rate limits) + one
Celery worker, on a fresh database (`exchange_bench_wallet`, Redis db 10).

Setup: the demo world (coins, networks), then ACCOUNTS accounts made by a setup subprocess through
the ORM and services: each with an API key, a whitelisted USDT (TRX) address and 1,000,000 USDT.
Rate limits are raised (IP_/UID_WEIGHT_LIMIT_PER_MINUTE); the default limit tier stays.

1. applied_per_s: signed POST /openapi/wallet/v1/withdraw/apply (10 USDT on TRX) per second,
   measured by wrk cycling through one pre-signed request per account (params in the query string,
   recvWindow=60000, each line signed with its own timestamp: replays are refused), 16 connections against
   the REST server (BENCH_WORKERS (3) workers x BENCH_THREADS (4) threads, warmed up first), no worker
   running, so the figure is the API alone. Each apply checks whitelist, amount, limits (from the
   journal), holds amount + fee through the ledger and enqueues the settlement task on Redis.
2. settled_per_s: the queue those applies left behind is drained by ONE worker
   (`celery -A exchange worker`, prefork, as in the full stack, harness); rate = (N - 1) / (last SUCCEEDED -
   first SUCCEEDED), from the withdrawals' own timestamps, so worker start-up is not counted.
   Measured with --concurrency 1 and with --concurrency 2 (the full stack's, harness), one apply round before
   each.

Ends with the ledger check and: every withdrawal SUCCEEDED, one settle posting and one chain
transaction each.

headline: settled_per_s with one worker at the full stack's --concurrency 2.
"""

import json
import os
import subprocess
import sys
import time

from bench import _bench
from harness.layout import ROOT
from harness.ports import free_port

SECONDS = int(os.environ.get("BENCH_SECONDS", "6"))
ACCOUNTS = int(os.environ.get("BENCH_ACCOUNTS", "200"))
WEB_WORKERS = int(os.environ.get("BENCH_WORKERS", "3"))
WEB_THREADS = int(os.environ.get("BENCH_THREADS", "4"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "16"))
WARMUP_SECONDS = int(os.environ.get("BENCH_WARMUP_SECONDS", "5"))
SETTLE_TIMEOUT = float(os.environ.get("BENCH_SETTLE_TIMEOUT", "150"))
AMOUNT = "10"  # USDT on TRX: the network's minimum; fee 1 USDT

_WRK_LUA = """
local requests = {}
-- Formatted in init, once wrk has set its Host header (at load time it has not: HTTP/1.1 without Host,
-- which granian hands to Django as an empty Host, refused with 400).
init = function(args)
  for line in io.lines("%s") do
    local key, path = line:match("^(%%S+) (%%S+)$")
    requests[#requests + 1] = wrk.format("POST", path, {["X-SERVICE-APIKEY"] = key})
  end
end
local i = 0
request = function()
  i = i %% #requests + 1
  return requests[i]
end
local non2xx = 0
response = function(status, headers, body)
  if status ~= 200 then
    non2xx = non2xx + 1
    if non2xx <= 3 then io.stderr:write(status .. " " .. body .. "\\n") end
  end
end
done = function(summary, latency, requests)
  io.write(string.format("non200 %%d\\n", non2xx))
end
"""


def signed_requests(accounts: list[list[str]], rounds: int = 20) -> list[str]:
    """Each line signed with its own timestamp: the service refuses a replayed signature, so no
    line may repeat within a run (rounds x accounts lines)."""
    import hashlib
    import hmac
    from urllib.parse import urlencode

    stamp = int(time.time() * 1000)
    lines = []
    n = 0
    for _ in range(rounds):
        for key, secret, address in accounts:
            query = urlencode(
                {
                    "coin": "USDT",
                    "network": "TRX",
                    "address": address,
                    "amount": AMOUNT,
                    "recvWindow": 60000,
                    "timestamp": stamp - n,
                }
            )
            n += 1
            signature = hmac.new(secret.encode(), query.encode(), hashlib.sha256).hexdigest()
            lines.append(f"{key} /openapi/wallet/v1/withdraw/apply?{query}&signature={signature}")
    return lines


def wrk_post(port: int, lines: list[str], seconds: int, connections: int = CONNECTIONS) -> dict[str, float]:
    lua = lambda data: _WRK_LUA % data  # noqa: E731 - the script around the requests' file
    out = _bench.run_wrk(port, lua, lines, seconds=seconds, connections=connections, timeout="10s")
    return {
        "rps": _bench.wrk_rps(out),
        "non200": _bench.non2xx(out) + _bench.socket_errors(out),
        **_bench.wrk_latency(out),
    }


class Db:
    def __init__(self, url: str):
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def one(self, sql: str, *args):
        return self.conn.execute(sql, args).fetchone()

    def wait_quiet(self, quiet: float = 1.0) -> None:
        """Until no withdrawal has been applied for `quiet` seconds."""
        seen, since = None, time.perf_counter()
        while time.perf_counter() - since < quiet:
            count = self.one("SELECT count(*) FROM wallet_withdrawal")[0]
            if count != seen:
                seen, since = count, time.perf_counter()
            time.sleep(0.1)

    def stages(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT stage, count(*) FROM wallet_withdrawal GROUP BY stage").fetchall())


def settle(env: dict[str, str], db: Db, concurrency: int, since_id: int) -> dict[str, float]:
    """Start one worker on the queue left behind; wait until every withdrawal after since_id is settled."""
    total = db.one("SELECT count(*) FROM wallet_withdrawal WHERE id > %s", since_id)[0]
    worker = [
        str(_bench.VENV_BIN / "celery"),
        "-A",
        "exchange",
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "info",
        "--hostname",
        f"bench{concurrency}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    started = time.perf_counter()
    with _bench.process(worker, env):
        deadline = started + SETTLE_TIMEOUT
        while True:
            pending = db.one(
                "SELECT count(*) FROM wallet_withdrawal WHERE id > %s AND stage IN ('QUEUED', 'BROADCASTING')",
                since_id,
            )[0]
            if pending == 0:
                break
            if time.perf_counter() > deadline:
                sys.exit(f"{pending} of {total} withdrawals not settled after {SETTLE_TIMEOUT:.0f}s")
            time.sleep(0.25)
        wall = time.perf_counter() - started
    succeeded, first, last = db.one(
        "SELECT count(*), min(updated_at), max(updated_at) FROM wallet_withdrawal"
        " WHERE id > %s AND stage = 'SUCCEEDED'",
        since_id,
    )
    span = (last - first).total_seconds() if succeeded > 1 else 0.0
    return {
        "total": total,
        "succeeded": succeeded,
        "span_s": span,
        "wall_s": wall,
        "per_s": (succeeded - 1) / span if span > 0 else 0.0,
    }


def main() -> None:
    env = _bench.bench_env(
        "exchange_bench_wallet",
        10,
        IP_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        UID_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        CELERY_TASK_ALWAYS_EAGER="false",
    )
    env.pop("CELERY_BROKER_URL", None)
    env.pop("RATE_LIMIT_STORAGE_URL", None)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    _bench.recreate_database(env)
    _bench.manage(env, "demo")
    made = subprocess.run(
        [_bench.PYTHON, "-m", "bench.programs.wallet_accounts", str(ACCOUNTS)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    accounts = json.loads(made.stdout.strip().splitlines()[-1])
    setup_s = time.perf_counter() - t0
    db = Db(env["DATABASE_URL"])

    port = free_port()
    # gunicorn: --preload sets Django up before the workers fork, so they serve as soon as the port answers.
    server = _bench.rest_server(port, workers=WEB_WORKERS, threads=WEB_THREADS, gunicorn_preload=True)
    applied, settled = [], {}
    with _bench.process(server.args, env, port):
        # Warm up: enough connections that every worker and thread serves (each connects to PostgreSQL
        # and Redis lazily), and long enough for the slowest; these withdrawals are settled too.
        wrk_post(port, signed_requests(accounts), WARMUP_SECONDS, connections=4 * WEB_WORKERS * WEB_THREADS)
        db.wait_quiet(2.0)
        for concurrency in (1, 2):
            since = db.one("SELECT coalesce(max(id), 0) FROM wallet_withdrawal")[0]
            if concurrency == 1:
                since = 0  # the warm-up's withdrawals are settled in the first round
            applied.append(wrk_post(port, signed_requests(accounts), SECONDS))
            db.wait_quiet(2.0)  # requests wrk left queued in the server finish before the worker starts
            settled[concurrency] = settle(env, db, concurrency, since)

    check = subprocess.run(
        [_bench.PYTHON, "manage.py", "ledger_check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    stages = db.stages()
    total = sum(stages.values())
    settles = db.one("SELECT count(*) FROM accounts_posting WHERE reference LIKE 'withdrawal:%%:settle'")[0]
    broadcasts = db.one("SELECT count(*) FROM wallet_simtransaction WHERE client_reference LIKE 'withdrawal:%%'")[0]
    errors = sum(r["non200"] for r in applied)
    applied_rps = sum(r["rps"] for r in applied) / len(applied)

    print(f"load_average_1m: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after ({os.cpu_count()} cores)")
    print(f"server: {server.label}, PostgreSQL, Redis broker and rate limits")
    print(f"setup: {ACCOUNTS} accounts (API key, whitelisted USDT/TRX address, funds) in {setup_s:.1f}s incl. migrate")
    print(f"apply: wrk {CONNECTIONS} connections, {SECONDS}s x {len(applied)} rounds, no worker running")
    print(f"applied_per_s: {applied_rps:.0f}")
    print(f"apply_p50_ms: {applied[-1]['p50_ms']:.2f}")
    print(f"apply_p99_ms: {applied[-1]['p99_ms']:.2f}")
    print(f"apply_errors: {errors} (non-200 responses and socket errors)")
    for concurrency, result in settled.items():
        print(f"settled_withdrawals_c{concurrency}: {result['succeeded']} of {result['total']}")
        print(f"settled_per_s_c{concurrency}: {result['per_s']:.0f}")
        print(f"settle_wall_s_c{concurrency}: {result['wall_s']:.1f} (worker start-up included)")
    print(f"withdrawals: {total} ({', '.join(f'{k} {v}' for k, v in sorted(stages.items()))})")
    print(f"settle_postings: {settles}")
    print(f"chain_broadcasts: {broadcasts}")
    print(f"ledger_check_ok: {check.returncode == 0}")
    print(f"headline: {settled[2]['per_s']:.0f}")
    problems = []
    if errors:
        problems.append(f"{errors} apply requests failed")
    if stages.get("SUCCEEDED", 0) != total or settles != total or broadcasts != total:
        problems.append("not every withdrawal settled exactly once")
    if check.returncode != 0:
        problems.append("the ledger check failed:\n" + check.stdout + check.stderr)
    if problems:
        sys.exit("; ".join(problems) + "; the figures are not valid")


if __name__ == "__main__":
    main()
