#!/usr/bin/env python3
"""Conversions on the full stack, against bench/transfers' transfers in the same run.

1. convert_per_s: accepted conversions per second. CLIENTS (32) concurrent clients, each on
   ACCOUNTS_PER_CLIENT (2, BENCH_CONVERT_ACCOUNTS_PER_CLIENT) accounts of its own in turn, each
   account with its own API key, each client in a loop: signed POST /openapi/convert/v1/get-quote (a small
   sourceAmount; the clients rotate through the 8 demo pairs, both directions of BTC/PHP, USDT/PHP,
   ETH/USDT and BTC/USDT, so balances last), then signed accept-quote of the returned quoteId. Only
   SUCCESS accepts count; every failure is counted by its message. The per-pair quote interval
   (CONVERT_QUOTE_INTERVAL_MS, default 1000 ms per account and pair) stays on: a client that would
   ask for the same pair on the same account again within the interval waits (counted as
   `throttle_waits`; with 8 pairs and 2 accounts that only happens above 16 conversions per second
   per client: with one account the interval capped the bench at 256/s once a conversion got
   cheaper). BENCH_CONVERT_QUOTE_INTERVAL_MS=0 turns the interval off instead. The clients: one
   asyncio process (this one) speaking HTTP/1.1
   keep-alive, signing every request live (the quote id is only known from the answer); their CPU
   per conversion is printed. p50/p99 latency of get-quote + accept, and of accept alone.
2. transfers_per_s: bench/transfers' load (its code, imported: its accounts, pre-signed bodies and
   wrk with the same number of connections as clients above), in the same server, one round
   before each convert round, so each ratio's two sides see the machine in the same state.

The stack: exactly as `make run` starts it with DATABASE_URL and REDIS_URL (harness/make_run.py:
nginx in front of granian and Daphne, the Celery worker and beat - the beat's market tick keeps the
prices fresh: a price older than 30 s is not quoted), requests through nginx. Fresh database
`exchange_bench_convert`, Redis db 7 (BENCH_DATABASE_NAME and BENCH_REDIS_DB change them, for a second
engineer's run on the same PostgreSQL and Redis). The demo world (markets, pairs, the house's liquidity over
CONVERT_LIQUIDITY_SHARDS (16) shards); bench/transfers' accounts (its setup: an API key and
1,000,000 PHP each, from equity through the ledger), each also given 1 BTC, 10 ETH and 100,000 USDT
the same way; the convert clients use the first CLIENTS x ACCOUNTS_PER_CLIENT of them.

Diagnostics (not in the headline): CPU ms per transfer and per conversion during the rounds, of
the server's processes, of the PostgreSQL backends of the bench database (other work on the shared
PostgreSQL left out) and of Redis (all of it); the clients' own CPU; `lock_waits`, the mean number
of the bench database's backends waiting on a lock during the convert rounds (pg_stat_activity,
sampled every 50 ms); and one get-quote, accept and transfer at a time through the services in
process (no HTTP), in ms of wall and CPU time.

Then, unless BENCH_ONE_SHARD=0, the stack is started again (`make run`, a fresh database, the same
setup) with CONVERT_LIQUIDITY_SHARDS=1 (every conversion on one liquidity account, i.e. one ledger
lock) for as many pairs of rounds: the same ratio, as a check of the lock design.

After each stack's run: SUCCESS orders = SUCCESS answers = CONVERT postings, and the ledger check passes.

headline: convert_per_s / transfers_per_s, the means over the rounds (target >= 0.5, issue 29; it was 0.8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

from bench import _bench, transfers
from bench._convert_load import PLAN, Client, LockWaits, convert_round, cpu_by_process, cpu_used
from harness.layout import ROOT
from harness.make_run import make_run, stack_label

CLIENTS = transfers.CONNECTIONS  # BENCH_CONNECTIONS (32): as many clients as bench/transfers' connections
SECONDS = transfers.SECONDS  # BENCH_SECONDS (10)
ROUNDS = transfers.ROUNDS  # BENCH_ROUNDS (2)
WARMUP_SECONDS = 3
ONE_SHARD = os.environ.get("BENCH_ONE_SHARD", "1") != "0"
QUOTE_INTERVAL_MS = os.environ.get("BENCH_CONVERT_QUOTE_INTERVAL_MS")  # None: the service's default
ACCOUNTS_PER_CLIENT = int(os.environ.get("BENCH_CONVERT_ACCOUNTS_PER_CLIENT", "2"))
DB_NAME = os.environ.get("BENCH_DATABASE_NAME", "exchange_bench_convert")
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "7"))
FUNDS = {"BTC": "1", "ETH": "10", "USDT": "100000"}


def setup_accounts(env: dict[str, str], count: int, domain: str) -> list[list[str]]:
    """bench/transfers' accounts: `count` users with an API key (every type) and 1,000,000 PHP."""
    made = subprocess.run(
        [_bench.PYTHON, "-m", "bench.programs.transfer_accounts", str(count), domain],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(made.stdout.strip().splitlines()[-1])


def mean_waits(runs: list[dict]) -> float:
    return sum(r["lock_waiting"] for r in runs) / len(runs)


def script_lines(env: dict[str, str], module: str, *args: str) -> dict[str, str]:
    """The `name value` lines `python -m module args` prints, run in the project with `env`."""
    done = subprocess.run(
        [_bench.PYTHON, "-m", module, *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return dict(line.split() for line in done.stdout.splitlines())


def stack_phase(env: dict[str, str], count: int, *, serial: bool) -> dict:
    """Start the stack as `make run` does (a fresh database, migrated, the demo world: assets, limit
    tier, markets, pairs, the house's liquidity over the shards), set up bench/transfers' accounts
    and the convert funds, run a warm-up and `count` pairs of rounds (and, if `serial`, the
    in-process timings), stop the stack, then read what the database holds and check the ledger."""
    import psycopg

    t0 = time.perf_counter()
    out: dict = {}
    with make_run(env) as running:
        transfer_accounts = setup_accounts(env, transfers.ACCOUNTS, transfers.DOMAIN)
        if len(transfer_accounts) < CLIENTS * ACCOUNTS_PER_CLIENT:
            raise SystemExit(
                f"BENCH_CONNECTIONS={CLIENTS} x {ACCOUNTS_PER_CLIENT} needs at least as many accounts (BENCH_ACCOUNTS)"
            )
        # The convert clients use the first CLIENTS x ACCOUNTS_PER_CLIENT of these accounts (consecutive
        # ids: every liquidity shard serves as many of them); the two loads never run at the same time.
        convert_accounts = [transfer_accounts[i::CLIENTS][:ACCOUNTS_PER_CLIENT] for i in range(CLIENTS)]
        subprocess.run(
            [
                _bench.PYTHON,
                "-m",
                "bench.programs.convert_fund",
                transfers.DOMAIN,
                *(f"{code}={amount}" for code, amount in FUNDS.items()),
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        out["setup_s"] = time.perf_counter() - t0
        out["label"] = stack_label(running)
        interval_ms = int(
            script_lines(env, "bench.programs.setting", "CONVERT_QUOTE_INTERVAL_MS")["CONVERT_QUOTE_INTERVAL_MS"]
        )
        out["interval_ms"] = interval_ms
        db = psycopg.connect(env["DATABASE_URL"], autocommit=True)

        def one(sql: str):
            return db.execute(sql).fetchone()[0]

        def drain() -> None:
            """wrk stops without waiting for in-flight responses: let the server finish them."""
            count, deadline = one("SELECT count(*) FROM wallet_transfer"), time.monotonic() + 15
            while time.monotonic() < deadline:
                time.sleep(0.5)
                now = one("SELECT count(*) FROM wallet_transfer")
                if now == count:
                    break
                count = now

        # The beat's first market tick: the demo's asset prices may be older than the 30 s that are quoted.
        deadline = time.monotonic() + 60
        while not one(
            "SELECT coalesce(min(price_updated_at) > now() - interval '10 seconds', false) FROM convert_assetprice"
        ):
            if time.monotonic() > deadline:
                raise SystemExit("the prices were not refreshed within 60 s: is the Celery beat running?")
            time.sleep(0.5)
        out["liquidity_before"] = liquidity(db)
        port = running.port
        clients = [Client(port, accounts, offset=i) for i, accounts in enumerate(convert_accounts)]
        # Warm up (connections, keyrings, caches), both loads.
        transfers.wrk_post(port, transfers.signed_bodies(transfer_accounts), WARMUP_SECONDS)
        drain()
        out["warm"] = convert_round(clients, WARMUP_SECONDS, interval_ms)
        t_runs, c_runs, cpu = [], [], {"transfer": {}, "convert": {}}
        for _ in range(count):
            # A transfers round, then a convert round: each pair sees the machine in the same state.
            bodies = transfers.signed_bodies(transfer_accounts)
            before = cpu_by_process(running.pid, DB_NAME)
            t_runs.append(transfers.wrk_post(port, bodies, SECONDS))
            after = cpu_by_process(running.pid, DB_NAME)
            drain()
            for name, seconds in cpu_used(before, after).items():
                cpu["transfer"][name] = cpu["transfer"].get(name, 0.0) + seconds
            before = cpu_by_process(running.pid, DB_NAME)
            with LockWaits(env["DATABASE_URL"], DB_NAME) as waits:
                c_runs.append(convert_round(clients, SECONDS, interval_ms))
            c_runs[-1]["lock_waiting"] = waits.mean
            for name, seconds in cpu_used(before, cpu_by_process(running.pid, DB_NAME)).items():
                cpu["convert"][name] = cpu["convert"].get(name, 0.0) + seconds
        out.update(t_runs=t_runs, c_runs=c_runs, cpu=cpu)
        if serial:
            # In process, one at a time: what the services cost without HTTP and the gateway. The
            # accounts CLIENTS.., each pair once per account, once the rounds' quote interval passed.
            time.sleep(max(interval_ms, 0) / 1000 + 0.1)
            out["serial"] = script_lines(
                env, "bench.programs.convert_serial", transfers.DOMAIN, str(CLIENTS), json.dumps(PLAN)
            )
            out["serial_transfer"] = script_lines(env, "bench.programs.transfer_serial", transfers.DOMAIN)
    check = subprocess.run(
        [_bench.PYTHON, "manage.py", "ledger_check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    out["check"] = check
    out["success_orders"] = one("SELECT count(*) FROM convert_order WHERE status = 'SUCCESS'")
    out["failed_orders"] = one("SELECT count(*) FROM convert_order WHERE status = 'FAILED'")
    out["postings"] = one("SELECT count(*) FROM accounts_posting WHERE kind = 'CONVERT'")
    out["shards_used"] = one("SELECT count(*) FROM accounts_user WHERE system_role = 'convert_liquidity'")
    out["liquidity_after"] = liquidity(db)
    db.close()
    runs = [out["warm"], *c_runs]
    out["answered_success"] = sum(r["accepted_total"] for r in runs) + int(out.get("serial", {}).get("conversions", 0))
    return out


def liquidity(db) -> dict[str, str]:
    rows = db.execute(
        "SELECT a.code, sum(b.free) FROM accounts_balance b JOIN accounts_user u ON u.id = b.account_id"
        " JOIN accounts_asset a ON a.id = b.asset_id WHERE u.system_role = 'convert_liquidity'"
        " GROUP BY a.code ORDER BY a.code"
    ).fetchall()
    return {code: f"{amount.normalize():f}" for code, amount in rows}


def main() -> None:
    extra = {"CONVERT_QUOTE_INTERVAL_MS": QUOTE_INTERVAL_MS} if QUOTE_INTERVAL_MS is not None else {}
    env = _bench.bench_env(
        DB_NAME,
        REDIS_DB,
        IP_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        UID_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        **extra,
    )
    env.pop("RATE_LIMIT_STORAGE_URL", None)
    env.pop("CELERY_BROKER_URL", None)  # the bench's Redis db
    load_before = os.getloadavg()[0]
    main_phase = stack_phase(env, ROUNDS, serial=True)
    load_mid = os.getloadavg()[0]
    # The same on one liquidity account (one ledger lock): a second start of the stack, fresh database.
    one_shard = stack_phase({**env, "CONVERT_LIQUIDITY_SHARDS": "1"}, ROUNDS, serial=False) if ONE_SHARD else None
    load_after = os.getloadavg()[0]
    label, setup_s, interval_ms = main_phase["label"], main_phase["setup_s"], main_phase["interval_ms"]
    t_runs, c_runs, cpu = main_phase["t_runs"], main_phase["c_runs"], main_phase["cpu"]
    serial, serial_transfer = main_phase["serial"], main_phase["serial_transfer"]
    liquidity_before, liquidity_after = main_phase["liquidity_before"], main_phase["liquidity_after"]
    shards_used, check = main_phase["shards_used"], main_phase["check"]
    success_orders, failed_orders = main_phase["success_orders"], main_phase["failed_orders"]
    postings, answered_success = main_phase["postings"], main_phase["answered_success"]
    phases = [main_phase] + ([one_shard] if one_shard else [])
    all_convert = [run for phase in phases for run in (phase["warm"], *phase["c_runs"])]
    failures = Counter()
    for run in c_runs:
        failures.update(run["failures"])
    all_failures = Counter()
    for run in all_convert:
        all_failures.update(run["failures"])
    t_rate = sum(r["rps"] for r in t_runs) / len(t_runs)
    c_rate = sum(r["rps"] for r in c_runs) / len(c_runs)
    # The CPU readings include the conversions the clients finished after each round's end.
    conversions = sum(r["accepted_total"] for r in c_runs)
    completed = sum(r["completed"] for r in t_runs)
    t_errors = sum(r["non200"] + r["socket_errors"] for r in t_runs)
    mid = len(c_runs) // 2

    def median(key: str, runs: list) -> float:
        return sorted(r[key] for r in runs)[mid]

    def per(kind: str, count: int) -> str:
        return ", ".join(f"{name} {seconds / max(count, 1) * 1000:.2f}" for name, seconds in cpu[kind].items())

    quote_rule = (
        "the clients rotate through the 8 pairs (each client quotes a given pair at most once per"
        f" {interval_ms} ms: CONVERT_QUOTE_INTERVAL_MS={interval_ms}, the service's rule)"
        if interval_ms > 0
        else "CONVERT_QUOTE_INTERVAL_MS=0 (the per-pair quote interval off); the clients rotate through the 8 pairs"
    )
    print(f"server: {label}")
    print(
        f"setup: bench/transfers' {transfers.ACCOUNTS} accounts (API key, 1000000 PHP), each also given"
        f" {', '.join(f'{a} {c}' for c, a in FUNDS.items())}; the convert clients use the first"
        f" {CLIENTS * ACCOUNTS_PER_CLIENT};"
        f" in {setup_s:.1f}s incl. migrate"
    )
    print(f"liquidity: {shards_used} shards of the house's convert liquidity, in total {liquidity_before} (the demo's)")
    print(
        f"load: {CLIENTS} clients on {CLIENTS * ACCOUNTS_PER_CLIENT} accounts, each get-quote then accept-quote,"
        f" {SECONDS}s x {ROUNDS} rounds; transfers: bench/transfers' wrk, {transfers.CONNECTIONS} connections,"
        " one round before each"
    )
    print(f"quote_interval: {quote_rule}; throttle_waits {sum(r['throttle_waits'] for r in c_runs)}")
    print(f"transfers_per_s: {t_rate:.0f}")
    print(f"transfer_p50_ms: {median('p50_ms', t_runs):.2f}")
    print(f"transfer_p99_ms: {max(r['p99_ms'] for r in t_runs):.2f}")
    print(f"convert_per_s: {c_rate:.0f} (accepted conversions; {2 * c_rate:.0f} requests/s)")
    print(f"convert_quote_accept_p50_ms: {median('p50_ms', c_runs):.2f}")
    print(f"convert_quote_accept_p99_ms: {max(r['p99_ms'] for r in c_runs):.2f}")
    print(f"convert_accept_p50_ms: {median('accept_p50_ms', c_runs):.2f}")
    print(f"convert_accept_p99_ms: {max(r['accept_p99_ms'] for r in c_runs):.2f}")
    print(
        f"cpu_ms_per_transfer: {per('transfer', completed)}; cpu_ms_per_conversion: {per('convert', conversions)}"
        " (process CPU time during the rounds: the server's processes, the PostgreSQL backends of this database,"
        " the whole Redis)"
    )
    web_t = cpu["transfer"].get("web", 0.0) / max(completed, 1) * 1000
    web_c = cpu["convert"].get("web", 0.0) / max(conversions, 1) * 1000
    all_t = sum(cpu["transfer"].values()) / max(completed, 1) * 1000
    all_c = sum(cpu["convert"].values()) / max(conversions, 1) * 1000
    print(
        f"cpu_split_per_conversion: web {web_c:.2f} ms = {web_c / max(web_t, 1e-9):.2f} x a transfer's {web_t:.2f}"
        f" (target <= 2: quote + accept against one transfer); web + PostgreSQL + Redis {all_c:.2f} ms"
        f" = {all_c / max(all_t, 1e-9):.2f} x a transfer's {all_t:.2f} (the headline follows this ratio's inverse)"
    )
    client_ms = sum(r["client_cpu_s"] for r in c_runs) / max(conversions, 1) * 1000
    print(f"client_cpu_ms_per_conversion: {client_ms:.2f} (this process, the 32 convert clients)")
    print(f"convert_failures: {dict(failures) or 'none'}")
    print(f"transfer_errors: {t_errors} (non-200 responses and socket errors)")
    print(
        "rounds (convert/s / transfers/s): "
        + ", ".join(
            f"{c['rps']:.0f} / {t['rps']:.0f} = {c['rps'] / t['rps']:.2f}" for t, c in zip(t_runs, c_runs, strict=True)
        )
    )
    print(f"lock_waits: {mean_waits(c_runs):.2f} (PostgreSQL backends waiting on a lock, mean of samples every 50 ms)")
    if one_shard:
        t1, c1 = one_shard["t_runs"], one_shard["c_runs"]
        c1_rate, t1_rate = sum(r["rps"] for r in c1) / len(c1), sum(r["rps"] for r in t1) / len(t1)
        ratios = ", ".join(f"{c['rps'] / t['rps']:.2f}" for t, c in zip(t1, c1, strict=True))
        print(
            f"one_liquidity_shard (CONVERT_LIQUIDITY_SHARDS=1, a second server start, {len(c1)} pairs of rounds):"
            f" convert/s {c1_rate:.0f}, transfers/s {t1_rate:.0f}, ratio {c1_rate / t1_rate:.2f}"
            f" ({ratios}),"
            f" quote+accept p50 {sorted(r['p50_ms'] for r in c1)[len(c1) // 2]:.2f}"
            f" p99 {max(r['p99_ms'] for r in c1):.2f} ms,"
            f" accept p50 {sorted(r['accept_p50_ms'] for r in c1)[len(c1) // 2]:.2f}"
            f" p99 {max(r['accept_p99_ms'] for r in c1):.2f} ms, lock_waits {mean_waits(c1):.2f}"
        )
    print(
        "serial_in_process_ms (one at a time, no HTTP; wall / CPU):"
        f" get-quote {serial['quote']} / {serial['quote_cpu']},"
        f" accept {serial['accept']} / {serial['accept_cpu']}, a transfer {serial_transfer['with_listeners']}"
        f" / {serial_transfer['with_listeners_cpu']}"
    )
    print(
        f"orders: {success_orders} SUCCESS ({answered_success} answered SUCCESS, the in-process ones included),"
        f" {failed_orders} FAILED"
    )
    print(f"convert_postings: {postings}")
    print(f"liquidity_after: {liquidity_after}")
    print(f"ledger_check_ok: {check.returncode == 0}")
    print(
        f"load_average_1m: {load_before:.1f} before, {load_mid:.1f} after the main rounds,"
        f" {load_after:.1f} at the end, on {os.cpu_count()} cores"
    )
    print(f"headline: {c_rate / t_rate:.2f}")
    problems = []
    if t_errors:
        problems.append(f"{t_errors} transfer requests failed")
    broken = {k: n for k, n in all_failures.items() if k.startswith("connection") or " HTTP " in k}
    if broken:  # refusals in the convert envelope are counted above; these are not answers at all
        problems.append(f"convert requests failed: {broken}")
    for n, phase in enumerate(phases):
        answered, orders, made = phase["answered_success"], phase["success_orders"], phase["postings"]
        if not orders == answered == made:
            problems.append(
                f"stack start {n + 1}: {answered} SUCCESS answers, {orders} SUCCESS orders, {made} postings"
            )
        if phase["check"].returncode != 0:
            problems.append(
                f"stack start {n + 1}: the ledger check failed:\n{phase['check'].stdout}{phase['check'].stderr}"
            )
    if problems:
        sys.exit("; ".join(problems) + "; the figures are not valid")


if __name__ == "__main__":
    main()
