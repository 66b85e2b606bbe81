"""Transfers between accounts on the full stack, against pgbench on the same PostgreSQL, in one run.

1. transfers_per_s: signed POST /openapi/transfer/v4/transfers per second through the stack exactly
   as `make run` starts it with DATABASE_URL and REDIS_URL (harness: nginx in front of
   granian's WSGI interface, one worker per core x STACK_REST_THREADS (6) blocking threads, Daphne,
   Celery worker and beat) + PostgreSQL + Redis (rate limits raised; the streams' fast path publishes
   to Redis after each commit), on a fresh database `exchange_bench_transfers` (Redis db 11;
   BENCH_DATABASE_NAME, BENCH_REDIS_DB and BENCH_PGBENCH_DATABASE_NAME change them).
   ACCOUNTS accounts, each with an API key and
   1,000,000 PHP; the default limit tier applies (checked against the limit counters on every
   transfer). wrk with CONNECTIONS (32) connections cycles through pre-signed requests (form
   body, recvWindow=60000, each line signed with its own timestamp because the service refuses a
   replayed signature; each sender to 8 different recipients by e-mail, 1 PHP). p50/p99 latency from wrk.
   After the run: every 200 left one Transfer row, and the ledger check passes.
2. pgbench_tps: pgbench's TPC-B (`pgbench -i -s 10` once, then `-c 32 -j 2 -T BENCH_PGBENCH_SECONDS`
   (10) before each transfers round, the REST server idle) on the same PostgreSQL server, database
   `exchange_pgbench`. Pairing the rounds keeps each ratio's two sides under the same machine
   conditions (this shared host's speed varies by +-15% from minute to minute).

Diagnostics (not in the headline): CPU ms per transfer of the stack's processes (nginx, granian,
Daphne, Celery: the process tree of `make run`), of PostgreSQL's
and of Redis's during the rounds (from /proc; PostgreSQL and Redis include other work on the
machine); one transfer at a time through the service in one process, with
and without the ledger's after-commit listeners (the streams relay's publish to Redis), in ms of
wall time and of the process's CPU time; and the machine's 1-minute load average before and after
(other work on the machine skews the figures: the Python side suffers from CPU contention far more
than pgbench does).

With BENCH_PHASES=1 the server runs bench/_phases.py (the same application, with per-phase CPU
accounting) and the run also prints `web_cpu_ms_per_request_by_phase`: where the web processes' CPU
goes (the accounting itself costs a few microseconds per request).

headline: transfers_per_s / pgbench_tps, the means over the rounds (target >= 0.25).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import _bench
from harness.layout import ROOT
from harness.make_run import make_run, stack_label

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
ACCOUNTS = int(os.environ.get("BENCH_ACCOUNTS", "64"))
RECIPIENTS_PER_SENDER = 8
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
PHASES = os.environ.get("BENCH_PHASES", "") == "1"
PGBENCH_SCALE = 10
PGBENCH_SECONDS = int(os.environ.get("BENCH_PGBENCH_SECONDS", "10"))
PGBENCH_DB = os.environ.get("BENCH_PGBENCH_DATABASE_NAME", "exchange_pgbench")
# Another engineer's run on the same servers takes other names (a fresh database is dropped first).
DB_NAME = os.environ.get("BENCH_DATABASE_NAME", "exchange_bench_transfers")
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "11"))
DOMAIN = "transfers.bench"

_WRK_LUA = """
local requests = {}
-- Formatted in init, once wrk has set its Host header (at load time it has not: HTTP/1.1 without Host).
init = function(args)
  for line in io.lines("%s") do
    local key, body = line:match("^(%%S+) (%%S+)$")
    requests[#requests + 1] = wrk.format("POST", "%s",
      {["X-SERVICE-APIKEY"] = key, ["Content-Type"] = "application/x-www-form-urlencoded"}, body)
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
  io.write(string.format("completed %%d\\n", summary.requests))
end
"""


def signed_bodies(accounts: list[list[str]], count: int = 20000) -> list[str]:
    """`count` lines `api_key body`, each body signed (recvWindow 60000) with its own timestamp:
    the service refuses a signature it has seen (replay protection), so no line may repeat within
    a run. Senders are interleaved so that consecutive requests come from different accounts."""
    import hashlib
    import hmac
    from urllib.parse import urlencode

    stamp = int(time.time() * 1000)
    lines = []
    n = 0
    while len(lines) < count:
        for k in range(1, RECIPIENTS_PER_SENDER + 1):
            for i, (_, key, secret) in enumerate(accounts):
                recipient = accounts[(i + k) % len(accounts)][0]
                body = urlencode(
                    {
                        "account": "PHP",
                        "target_address": recipient,
                        "amount": "1",
                        "recvWindow": 60000,
                        "timestamp": stamp - n,
                    }
                )
                n += 1
                signature = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
                lines.append(f"{key} {body}&signature={signature}")
    return lines[:count]


def wrk_post(
    port: int, lines: list[str], seconds: int, path: str = "/openapi/transfer/v4/transfers"
) -> dict[str, float]:
    """wrk POSTing `lines` (`api_key body`, see signed_bodies) to `path` in turn for `seconds`."""
    lua = lambda data: _WRK_LUA % (data, path)  # noqa: E731 - the script around the requests' file
    out = _bench.run_wrk(port, lua, lines, seconds=seconds, connections=CONNECTIONS, timeout="10s")
    return {
        "rps": _bench.wrk_rps(out),
        "non200": _bench.non2xx(out),
        "completed": int(re.search(r"completed (\d+)", out).group(1)),
        "socket_errors": _bench.socket_errors(out),
        **_bench.wrk_latency(out),
    }


class Pgbench:
    """TPC-B on the same server: a fresh `exchange_pgbench`, scale 10; rounds of 32 clients, 2 threads."""

    def __init__(self, database_url: str) -> None:
        match = re.fullmatch(r"postgres(?:ql)?://([^:]+):([^@]+)@([^:/]+):(\d+)/.*", database_url)
        user, password, host, port = match.groups()
        self.binary = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), key=lambda p: int(p.parts[-3]))[-1]
        self.version = self.binary.parts[-3]
        self.admin = database_url.rsplit("/", 1)[0] + "/postgres"
        self.env = {**os.environ, "PGPASSWORD": password}
        self.common = ["-h", host, "-p", port, "-U", user]

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql)

    def init(self) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {PGBENCH_DB} WITH (FORCE)")
        self._admin(f"CREATE DATABASE {PGBENCH_DB}")
        subprocess.run(
            [str(self.binary), *self.common, "-i", "-q", "-s", str(PGBENCH_SCALE), PGBENCH_DB],
            check=True,
            capture_output=True,
            text=True,
            env=self.env,
        )

    def run(self, seconds: int) -> dict[str, float]:
        out = subprocess.run(
            [str(self.binary), *self.common, "-c", "32", "-j", "2", "-T", str(seconds), PGBENCH_DB],
            check=True,
            capture_output=True,
            text=True,
            env=self.env,
        ).stdout
        latency = re.search(r"latency average = ([\d.]+) ms", out)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        return {
            "failed": int(failed.group(1)) if failed else 0,
            "tps": float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1)),
            "latency_ms": float(latency.group(1)) if latency else 0.0,
        }

    def drop(self) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {PGBENCH_DB} WITH (FORCE)")


def machine_ticks() -> list[int]:
    """The machine's CPU ticks so far: [busy, idle (incl. I/O wait), stolen by the hypervisor]."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return [user + nice + system + irq + softirq, idle + iowait, steal]


def cpu_seconds(server_pid: int) -> dict[str, float]:
    """CPU time (user + system) used so far by the server's processes, by PostgreSQL's and by
    Redis's (all of theirs: other work on the machine shows here too)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        stats[int(entry.name)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = set(), [server_pid]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    totals = {"stack": 0.0, "postgres": 0.0, "redis": 0.0}
    for pid, (name, _, seconds) in stats.items():
        if pid in tree:
            totals["stack"] += seconds
        elif name == "postgres" or name.startswith("postgres"):
            totals["postgres"] += seconds
        elif name.startswith("redis-server"):
            totals["redis"] += seconds
    return totals


def phase_summary(directory: str) -> str:
    """bench/_phases.py's per-process files, averaged over all requests of all processes."""
    totals: dict[str, float] = {}
    requests = 0
    for path in Path(directory).iterdir():
        values = dict(line.rsplit(" ", 1) for line in path.read_text().splitlines())
        count = int(values.pop("requests"))
        requests += count
        for name, per_request in values.items():
            totals[name] = totals.get(name, 0.0) + float(per_request) * count
    if not requests:
        return "no data"
    ms = {name: total / requests for name, total in totals.items()}
    rest = ms.get("process", 0.0) - ms.get("app", 0.0) - ms.get("publisher", 0.0)
    order = (
        "process",
        "app",
        "gateway",
        "transfer service",
        "service: look-up",
        "service: limit check",
        "service: posting",
        "database calls",
        "publisher",
    )
    parts = [f"{name} {ms[name]:.2f}" for name in order if name in ms]
    return ", ".join(parts) + f", rest of the process {rest:.2f} ({requests} requests)"


def main() -> None:
    import psycopg

    env = _bench.bench_env(
        DB_NAME,
        REDIS_DB,
        IP_WEIGHT_LIMIT_PER_MINUTE="1000000000",
        UID_WEIGHT_LIMIT_PER_MINUTE="1000000000",
    )
    env.pop("RATE_LIMIT_STORAGE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    phases_dir = None
    if PHASES:
        phases_dir = tempfile.mkdtemp(prefix="bench-phases-")
        env["BENCH_PHASES_DIR"] = phases_dir
        env["STACK_REST_APP"] = "bench._phases:application"
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    runs, pg_runs = [], []
    cpu = {}
    machine = [0, 0, 0]
    # The stack exactly as `make run` starts it (fresh database, migrate, the demo world: the assets
    # and the default limit tier), requests through its front (nginx).
    with make_run(env) as running:
        made = subprocess.run(
            [_bench.PYTHON, "-m", "bench.programs.transfer_accounts", str(ACCOUNTS), DOMAIN],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        accounts = json.loads(made.stdout.strip().splitlines()[-1])
        setup_s = time.perf_counter() - t0
        db = psycopg.connect(env["DATABASE_URL"], autocommit=True)

        def transfers() -> int:
            return db.execute("SELECT count(*) FROM wallet_transfer").fetchone()[0]

        def drain() -> int:
            """wrk stops without waiting for in-flight responses: let the server finish them."""
            count, deadline = transfers(), time.monotonic() + 15
            while time.monotonic() < deadline:
                time.sleep(0.5)
                now = transfers()
                if now == count:
                    break
                count = now
            return count

        port = running.port
        pgb = Pgbench(env["DATABASE_URL"])
        pgb.init()
        warm = wrk_post(port, signed_bodies(accounts), 3)  # connections, keyrings, caches
        before = drain()
        for _ in range(ROUNDS):
            # A pgbench round (the server idle: nothing in flight after drain()), then a transfers
            # round: each pair sees the machine in the same state, which varies on a shared host.
            pg_runs.append(pgb.run(PGBENCH_SECONDS))
            bodies = signed_bodies(accounts)
            cpu_before, machine_before = cpu_seconds(running.pid), machine_ticks()
            runs.append(wrk_post(port, bodies, SECONDS))
            for name, seconds in cpu_seconds(running.pid).items():
                cpu[name] = cpu.get(name, 0.0) + seconds - cpu_before.get(name, 0.0)
            machine = [a + now - then for a, now, then in zip(machine, machine_ticks(), machine_before, strict=True)]
            recorded = drain() - before
    load_after = os.getloadavg()[0]
    serial = dict(
        line.split()
        for line in subprocess.run(
            [_bench.PYTHON, "-m", "bench.programs.transfer_serial", DOMAIN],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    )
    ok_responses = sum(r["completed"] - r["non200"] for r in runs)
    errors = sum(r["non200"] + r["socket_errors"] for r in runs) + warm["non200"]
    check = subprocess.run(
        [_bench.PYTHON, "manage.py", "ledger_check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    kinds = dict(
        db.execute("SELECT kind, count(*) FROM accounts_posting WHERE kind = 'P2P_TRANSFER' GROUP BY kind").fetchall()
    )
    db.close()

    pgb.drop()
    tps = sum(r["tps"] for r in pg_runs) / len(pg_runs)
    rate = sum(r["rps"] for r in runs) / len(runs)
    p50 = sorted(r["p50_ms"] for r in runs)[len(runs) // 2]
    p99 = max(r["p99_ms"] for r in runs)

    print(f"server: {stack_label(running)}")
    print(f"setup: {ACCOUNTS} accounts with keys and 1,000,000 PHP each, in {setup_s:.1f}s incl. migrate")
    print(f"load: wrk {CONNECTIONS} connections, 1 thread, {SECONDS}s x {ROUNDS} rounds, 1 PHP per transfer")
    print(f"transfers_per_s: {rate:.0f}")
    print(f"transfer_p50_ms: {p50:.2f}")
    print(f"transfer_p99_ms: {p99:.2f}")
    completed = sum(r["completed"] for r in runs)
    print(
        "cpu_ms_per_transfer: "
        + ", ".join(f"{name} {seconds / completed * 1000:.2f}" for name, seconds in cpu.items())
        + " (process CPU time during the rounds / responses; postgres and redis include other work)"
    )
    total = sum(machine) or 1
    print(
        f"machine_during_rounds: busy {100 * machine[0] / total:.0f}%, idle {100 * machine[1] / total:.0f}%,"
        f" stolen by the host {100 * machine[2] / total:.0f}% (/proc/stat; steal = CPU the hypervisor gave others)"
    )
    print(f"non_200_responses: {errors}")
    print(f"transfers_recorded: {recorded} (200 responses: {ok_responses}; the rest were in flight when wrk stopped)")
    print(f"p2p_postings: {kinds.get('P2P_TRANSFER', 0)}")
    print(f"ledger_check_ok: {check.returncode == 0}")
    if phases_dir is not None:
        print(f"web_cpu_ms_per_request_by_phase: {phase_summary(phases_dir)}")
        shutil.rmtree(phases_dir, ignore_errors=True)
    print(f"serial_transfer_ms: {serial['with_listeners']} (one at a time, in process)")
    print(f"serial_transfer_cpu_ms: {serial['with_listeners_cpu']} (Python CPU time of the same)")
    print(f"serial_transfer_ms_without_after_commit_listeners: {serial['without_listeners']}")
    print(f"serial_transfer_cpu_ms_without_after_commit_listeners: {serial['without_listeners_cpu']}")
    print(f"load_average_1m: {load_before:.1f} before, {load_after:.1f} after the transfers, on {os.cpu_count()} cores")
    print(
        f"pgbench: PostgreSQL {pgb.version} TPC-B, scale {PGBENCH_SCALE}, -c 32 -j 2 -T {PGBENCH_SECONDS},"
        " one round before each transfers round"
    )
    print(f"pgbench_tps: {tps:.0f}")
    print(f"pgbench_latency_ms: {sum(r['latency_ms'] for r in pg_runs) / len(pg_runs):.2f}")
    print(
        "rounds (transfers/s / pgbench tps): "
        + ", ".join(
            f"{r['rps']:.0f} / {g['tps']:.0f} = {r['rps'] / g['tps']:.2f}" for r, g in zip(runs, pg_runs, strict=True)
        )
    )
    print(f"headline: {rate / tps:.2f}")
    problems = []
    if errors:
        problems.append(f"{errors} transfer requests failed")
    if recorded < ok_responses:
        problems.append(f"{ok_responses} transfers answered 200 but only {recorded} recorded")
    if check.returncode != 0:
        problems.append("the ledger check failed:\n" + check.stdout + check.stderr)
    failed = sum(r["failed"] for r in pg_runs)
    if failed:
        problems.append(f"pgbench: {failed} failed transactions")
    if problems:
        sys.exit("; ".join(problems) + "; the figures are not valid")


if __name__ == "__main__":
    main()
