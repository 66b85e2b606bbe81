"""Postings per second through `ledger.post` against the same database work done in raw SQL, on
the same fresh PostgreSQL database, in one run.

Both sides move a random amount between a random pair of 200 funded accounts. The raw side uses
psycopg directly and the statements a posting needs: lock both ledger rows in id order (FOR
UPDATE), bump their seq, read both balances, write both, insert the posting, its 2 entries and
its 2 change-feed rows, add to both accounts' limit counters (day, month, year), commit (the
database rules, e.g. the deferred zero-sum trigger, run for
both). Single thread and 4 threads (one connection each).

The posting function is measured as this process runs it (with the after-commit listeners the
apps register, e.g. the streams relay's fast path) and, as `postings_ledger_only`, with them
detached.

postings_hot_account: the ledger-only posting function with every posting paying from one account
(its ledger row is locked by each posting until its commit), at 1 and 4 threads: what one hot
account sustains when every process hits it.

headline: postings_ledger_only_per_s / raw_sql_per_s, single thread (target >= 0.5): the posting
function against the same database work. With the listeners attached, the streams relay's
publisher also runs in this process (it turns every posting into websocket events: queries, Redis)
and shares its CPU; that figure is printed as postings_per_s and ratio_with_listeners.
"""

import os
import random
import sys
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal

from bench import _bench

SECONDS = float(os.environ.get("BENCH_SECONDS", "6"))
ROUNDS = 2
ACCOUNTS = 200
THREADS = 4
ASSET = "BTC"


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()


def create_world() -> tuple[list[int], int]:
    """200 customers, each funded with 1,000,000 BTC from the outside world; their ids and BTC's."""
    from accounts import ledger
    from accounts.models import Asset, LedgerAccount, SystemRole, User

    asset = Asset.objects.create(code=ASSET, name="Bitcoin", transfer_precision=8)
    User.objects.bulk_create(
        [User(email=f"bench{i}@ledger.bench", password="!") for i in range(ACCOUNTS)]  # unusable password
    )
    ids = list(User.objects.filter(email__endswith="@ledger.bench").order_by("id").values_list("id", flat=True))
    LedgerAccount.objects.bulk_create([LedgerAccount(user_id=i) for i in ids], ignore_conflicts=True)
    world = ledger.system_account_id(SystemRole.WORLD)
    legs = [ledger.Leg(world, ASSET, Decimal(-1_000_000) * len(ids))]
    legs += [ledger.Leg(i, ASSET, Decimal(1_000_000)) for i in ids]
    ledger.post(legs=legs, kind="CHAIN_DEPOSIT", reference="bench:funding")
    return ids, asset.id


def amount(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(1, 10**8)).scaleb(-8)  # 0.00000001 .. 1


# --- the two sides -------------------------------------------------------------------------------------


def run_posting_function(ids: list[int], deadline: float, tag: str, seed: int, *, hot: bool = False) -> int:
    """Random pairs; with `hot`, every posting pays from the first account (one row lock for all threads)."""
    from django.db import connection

    from accounts import ledger

    rng = random.Random(seed)
    done = 0
    try:
        while time.perf_counter() < deadline:
            a, b = (ids[0], rng.choice(ids[1:])) if hot else rng.sample(ids, 2)
            ledger.post(legs=ledger.move(a, b, ASSET, amount(rng)), kind="P2P_TRANSFER", reference=f"{tag}:{done}")
            done += 1
    finally:
        connection.close()
    return done


def run_raw_sql(url: str, ids: list[int], asset: int, deadline: float, tag: str, seed: int) -> int:
    import psycopg

    rng = random.Random(seed)
    done = 0
    with psycopg.connect(url) as conn:
        while time.perf_counter() < deadline:
            source, target = rng.sample(ids, 2)
            raw_posting(conn, source, target, asset, amount(rng), f"{tag}:{done}")
            done += 1
    return done


def raw_posting(conn, source: int, target: int, asset: int, value: Decimal, reference: str) -> None:
    low, high = sorted((source, target))
    now = time.time()
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "SELECT user_id, seq FROM accounts_ledgeraccount WHERE user_id IN (%s, %s) ORDER BY user_id FOR UPDATE",
            (low, high),
        )
        seq = dict(cur.fetchall())
        cur.execute("UPDATE accounts_ledgeraccount SET seq = seq + 1 WHERE user_id IN (%s, %s)", (low, high))
        cur.execute(
            "SELECT account_id, free, locked FROM accounts_balance"
            " WHERE (account_id = %s AND asset_id = %s) OR (account_id = %s AND asset_id = %s)",
            (source, asset, target, asset),
        )
        balances = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
        free_source = balances[source][0] - value
        free_target = balances[target][0] + value
        if free_source < 0:
            raise RuntimeError("the bench never overdraws")
        cur.execute(
            "UPDATE accounts_balance AS b SET free = v.free, updated_at = to_timestamp(%s)"
            " FROM (VALUES (%s::bigint, %s::numeric), (%s::bigint, %s::numeric)) AS v(account_id, free)"
            " WHERE b.account_id = v.account_id AND b.asset_id = %s",
            (now, source, free_source, target, free_target, asset),
        )
        cur.execute(
            "INSERT INTO accounts_posting (kind, reference, memo, actor_id, created_at)"
            " VALUES ('P2P_TRANSFER', %s, '', NULL, to_timestamp(%s)) RETURNING id",
            (reference, now),
        )
        posting = cur.fetchone()[0]
        cur.execute(
            "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount)"
            " VALUES (%s, %s, %s, 'F', -1, %s), (%s, %s, %s, 'F', 1, %s)",
            (posting, source, asset, value, posting, target, asset, value),
        )
        cur.execute(
            "INSERT INTO accounts_balancechange (account_id, asset_id, posting_id, kind, seq, delta_free,"
            " delta_locked, free_after, locked_after, created_at, published_at) VALUES"
            " (%s, %s, %s, 'P2P_TRANSFER', %s, %s, 0, %s, %s, to_timestamp(%s), NULL),"
            " (%s, %s, %s, 'P2P_TRANSFER', %s, %s, 0, %s, %s, to_timestamp(%s), NULL)",
            (
                *(source, asset, posting, seq[source] + 1, -value, free_source, balances[source][1], now),
                *(target, asset, posting, seq[target] + 1, value, free_target, balances[target][1], now),
            ),
        )
        day = datetime.fromtimestamp(now, UTC).date()
        periods = (("D", day), ("M", day.replace(day=1)), ("Y", day.replace(month=1, day=1)))
        cur.execute(
            "INSERT INTO accounts_limitcounter AS l (account_id, asset_id, span, period_start, deposits,"
            " withdrawals, p2p_in, p2p_out) VALUES "
            + ", ".join(["(%s, %s, %s, %s, 0, 0, %s, %s)"] * 6)
            + " ON CONFLICT (account_id, span, period_start, asset_id) DO UPDATE SET"
            " p2p_in = l.p2p_in + excluded.p2p_in, p2p_out = l.p2p_out + excluded.p2p_out",
            [
                v
                for account, p2p_in, p2p_out in ((source, 0, value), (target, value, 0))
                for span, start in periods
                for v in (account, asset, span, start, p2p_in, p2p_out)
            ],
        )


# --- measuring -----------------------------------------------------------------------------------------


def per_second(threads: int, work, seconds: float) -> float:
    """Run work(deadline, thread_index) on `threads` threads for `seconds`; completed per second."""
    counts = [0] * threads
    errors: list[BaseException] = []
    start = time.perf_counter()
    deadline = start + seconds

    def runner(index: int) -> None:
        try:
            counts[index] = work(deadline, index)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=runner, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def main() -> None:
    env = _bench.bench_env(
        os.environ.get("BENCH_DATABASE_NAME", "exchange_bench_ledger"), int(os.environ.get("BENCH_REDIS_DB", "12"))
    )
    _bench.recreate_database(env)
    setup_django(env)
    from accounts.ledger import after_commit_listeners
    from accounts.ledger.check import ledger_check

    ids, asset = create_world()
    url = env["DATABASE_URL"]
    listeners = list(after_commit_listeners)  # e.g. the streams relay's fast path (Redis, one UPDATE)
    runs = iter(range(10**6))

    def posting_function(deadline: float, index: int, run: int) -> int:
        return run_posting_function(ids, deadline, f"post:{run}:{index}", seed=run * 100 + index)

    def hot_account(deadline: float, index: int, run: int) -> int:
        return run_posting_function(ids, deadline, f"hot:{run}:{index}", seed=run * 100 + index, hot=True)

    def raw_sql(deadline: float, index: int, run: int) -> int:
        return run_raw_sql(url, ids, asset, deadline, f"raw:{run}:{index}", seed=run * 100 + index)

    def measure(threads: int, side, *, with_listeners: bool = True, seconds: float = SECONDS) -> float:
        after_commit_listeners[:] = listeners if with_listeners else []
        try:
            run = next(runs)
            return per_second(threads, lambda deadline, index: side(deadline, index, run), seconds)
        finally:
            after_commit_listeners[:] = listeners

    measure(1, posting_function, seconds=1.0)  # warm up (imports, caches, connections, prepared statements)
    measure(1, raw_sql, seconds=1.0)

    sides = (
        ("postings", posting_function, True),  # ledger.post as this process runs it
        ("postings_ledger_only", posting_function, False),  # the same, after-commit listeners detached
        ("raw_sql", raw_sql, True),
        # Every thread pays from one account: the row lock on it serialises them (issue 28, capacity).
        ("postings_hot_account", hot_account, False),
    )
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(ROUNDS):  # interleaved, so drift (autovacuum, table growth) hits every side alike
        for threads in (1, THREADS):
            for name, side, with_listeners in sides:
                rate = measure(threads, side, with_listeners=with_listeners)
                results.setdefault((name, threads), []).append(rate)

    def mean(name: str, threads: int = 1) -> float:
        return sum(results[(name, threads)]) / ROUNDS

    check = ledger_check()
    print(f"setup: {ACCOUNTS} funded accounts, random pairs, {SECONDS:g}s x {ROUNDS} rounds per figure, PostgreSQL")
    print(f"after_commit_listeners: {', '.join(f.__module__ + '.' + f.__name__ for f in listeners) or 'none'}")
    for name, _, _ in sides:
        print(f"{name}_per_s: {mean(name):.0f}")
        print(f"{name}_per_s_{THREADS}_threads: {mean(name, THREADS):.0f}")
    print(f"ratio_ledger_only: {mean('postings_ledger_only') / mean('raw_sql'):.2f}")
    print(f"ratio_{THREADS}_threads: {mean('postings', THREADS) / mean('raw_sql', THREADS):.2f}")
    print(
        f"ratio_ledger_only_{THREADS}_threads: {mean('postings_ledger_only', THREADS) / mean('raw_sql', THREADS):.2f}"
    )
    print(f"ledger_check_ok: {check.ok} ({check.postings} postings)")
    print(f"ratio_with_listeners: {mean('postings') / mean('raw_sql'):.2f}")
    print(f"headline: {mean('postings_ledger_only') / mean('raw_sql'):.2f}")
    if not check.ok:
        sys.exit("the ledger check failed; the figures are not valid:\n" + check.report())


if __name__ == "__main__":
    main()
