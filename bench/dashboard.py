"""The operations dashboard and the customer page with 1,000,000 postings in the journal.

Builds the journal on a fresh PostgreSQL database (bench_dashboard) in SQL (INSERT ... SELECT over
generate_series, a few statements), with everything a posting writes kept consistent the way
`ledger.post()` would have left it: postings, entries (each posting sums to zero per asset: the
database's statement trigger checks it on insert), balances (the journal's sums), the change feed
(per-account sequence, free/locked after each posting, marked published), the ledger rows' sequence
and the limit counters (day, month, year). The ledger check (`ledger_check`, the same code as
`manage.py ledger_check`) then verifies the result; the figures are invalid if it fails.

The journal, spread evenly over the last 30 days (so every day of the chart has activity):
- one funding deposit per customer (CHAIN_DEPOSIT from its world shard, 1,000 of each asset) and one
  equity funding of every conversion-liquidity shard;
- then, per posting at random: 30 % deposits (100 of an asset, from the customer's world shard),
  10 % withdrawals (1 to the customer's world shard: one posting, where the wallet posts a hold and
  a settlement; the dashboard reads the same tables either way), 40 % transfers (0.5 to another
  customer), 20 % conversions (0.01 of an asset to the customer's liquidity shard, 1 of the next
  asset back).

Measured, logged in as a Support member through the Django test client (the whole request: the
admin's session and permission checks, the queries, the template):
- the first dashboard view with nothing folded yet (the view folds the rollup itself: a one-off);
- the dashboard, REQUESTS times (median, p99, max) once the rollup is folded (as the periodic
  `exchange.activity_rollup` task keeps it), with the last minute's postings as the live tail;
- the aggregation of a 20,000-posting tail (the most the view reads live before it folds);
- the customer page of a busy customer, REQUESTS times.

headline: dashboard median ms (target < 300).
"""

import os
import statistics
import sys
import time

from bench import _bench

POSTINGS = int(os.environ.get("BENCH_POSTINGS", "1000000"))
CUSTOMERS = int(os.environ.get("BENCH_CUSTOMERS", "20000"))
REQUESTS = int(os.environ.get("BENCH_REQUESTS", "20"))
ASSETS = ("BTC", "ETH", "USDT", "PHP")
TARGET_MS = 300.0


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()


def create_accounts() -> dict:
    """Assets, customers (with their ledger rows) and the house accounts; their ids."""
    from accounts import ledger
    from accounts.ledger.system import role_account_ids
    from accounts.models import Asset, LedgerAccount, SystemRole, User

    assets = [Asset.objects.get_or_create(code=code, defaults={"name": code})[0].id for code in ASSETS]
    User.objects.bulk_create(
        [User(email=f"c{i}@dashboard.bench", password="!") for i in range(CUSTOMERS)], batch_size=5000
    )
    customers = list(
        User.objects.filter(email__endswith="@dashboard.bench").order_by("id").values_list("id", flat=True)
    )
    LedgerAccount.objects.bulk_create([LedgerAccount(user_id=i) for i in customers], ignore_conflicts=True)
    return {
        "assets": assets,
        "customers": customers,
        "world": role_account_ids(SystemRole.WORLD),
        "liquidity": role_account_ids(SystemRole.CONVERT_LIQUIDITY),
        "equity": ledger.system_account_id(SystemRole.EQUITY),
    }


def build_journal(cursor, ids: dict) -> None:
    """The journal and everything that follows from it, in SQL."""
    assets = ids["assets"]
    liquidity_n, customers_n = len(ids["liquidity"]), len(ids["customers"])
    params = {
        "customers": ids["customers"],
        "customers_n": customers_n,
        "world": ids["world"],
        "world_n": len(ids["world"]),
        "liquidity": ids["liquidity"],
        "liquidity_n": liquidity_n,
        "funding_n": liquidity_n + customers_n,
        "equity": ids["equity"],
        "total": POSTINGS,
        "assets": assets,
    }
    cursor.execute("SELECT COALESCE(max(id), 0) FROM accounts_posting")
    params["first_id"] = cursor.fetchone()[0] + 1
    step("plan", cursor, PLAN, params)
    step("postings", cursor, POSTINGS_SQL, params)
    step("entries", cursor, ENTRIES, params)
    step("change feed", cursor, CHANGES, params)
    step("balances, sequences", cursor, BALANCES, params)
    step("limit counters", cursor, COUNTERS, params)
    cursor.execute("ANALYZE")


def step(name: str, cursor, sql: str, params: dict) -> None:
    began = time.perf_counter()
    cursor.execute(sql, params)
    print(f"build_{name.replace(', ', '_').replace(' ', '_')}_s: {time.perf_counter() - began:.1f}", flush=True)


# hashint: a cheap deterministic spread of g (no random(): the same journal every run).
PLAN = """
CREATE OR REPLACE FUNCTION pg_temp.hashint(x bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS
    $$ SELECT abs(hashtextextended(x::text, 0)) $$;
CREATE TEMP TABLE bench_customer AS
    SELECT (ordinality - 1)::bigint AS i, id FROM unnest(%(customers)s::bigint[]) WITH ORDINALITY AS id;
CREATE UNIQUE INDEX ON bench_customer (i);
ANALYZE bench_customer;
ANALYZE accounts_ledgeraccount;
CREATE TEMP TABLE bench_plan AS
WITH g AS (
    SELECT g, %(first_id)s::bigint + g AS pid,
        now() - interval '30 days' + (interval '30 days' - interval '5 seconds') * g / %(total)s AS created,
        CASE WHEN g < %(liquidity_n)s THEN 'LIQUIDITY' WHEN g < %(funding_n)s THEN 'FUNDING'
             ELSE (ARRAY['D','D','D','W','T','T','T','T','C','C'])[1 + pg_temp.hashint(g) %% 10] END AS shape,
        CASE WHEN g < %(funding_n)s THEN greatest(g - %(liquidity_n)s, 0)
             ELSE pg_temp.hashint(g * 7 + 1) %% %(customers_n)s END AS ci,
        pg_temp.hashint(g * 13 + 5) %% %(customers_n)s AS oi,
        (pg_temp.hashint(g * 31 + 3) %% 4)::int AS ai
    FROM generate_series(0::bigint, %(total)s - 1) AS g
)
SELECT g.g, g.pid, g.created, g.shape,
    (%(assets)s::bigint[])[1 + g.ai] AS asset, (%(assets)s::bigint[])[1 + (g.ai + 1) %% 4] AS asset2,
    CASE g.shape WHEN 'D' THEN 'CHAIN_DEPOSIT' WHEN 'FUNDING' THEN 'CHAIN_DEPOSIT' WHEN 'W' THEN 'CHAIN_WITHDRAWAL'
        WHEN 'T' THEN 'P2P_TRANSFER' WHEN 'C' THEN 'CONVERT' ELSE 'OTHERS' END AS kind,
    c.id AS customer,
    CASE WHEN o.id = c.id THEN (SELECT id FROM bench_customer WHERE i = (g.oi + 1) %% %(customers_n)s) ELSE o.id END
        AS other,
    (%(world)s::bigint[])[1 + c.id %% %(world_n)s] AS world,
    (%(liquidity)s::bigint[])[1 + (CASE WHEN g.shape = 'LIQUIDITY' THEN g.g ELSE c.id END) %% %(liquidity_n)s]
        AS liquidity
FROM g JOIN bench_customer c ON c.i = g.ci JOIN bench_customer o ON o.i = g.oi;
ANALYZE bench_plan;
"""

POSTINGS_SQL = """
INSERT INTO accounts_posting (id, kind, reference, memo, actor_id, created_at)
SELECT pid, kind, 'bench:' || g, '', NULL, created FROM bench_plan ORDER BY pid;
SELECT setval(pg_get_serial_sequence('accounts_posting', 'id'), (SELECT max(id) FROM accounts_posting));
"""

# Every posting's legs; written by one INSERT (the statement trigger checks each posting's sum).
ENTRIES = """
CREATE TEMP TABLE bench_leg AS
SELECT p.pid AS posting_id, p.kind, p.created, leg.account_id, leg.asset_id, leg.side::smallint AS side,
    leg.amount::numeric(36, 18) AS amount
FROM bench_plan p CROSS JOIN LATERAL (
    SELECT %(equity)s::bigint, a, -1, 1000000000 FROM unnest(%(assets)s::bigint[]) a WHERE p.shape = 'LIQUIDITY'
    UNION ALL SELECT p.liquidity, a, 1, 1000000000 FROM unnest(%(assets)s::bigint[]) a WHERE p.shape = 'LIQUIDITY'
    UNION ALL SELECT p.world, a, -1, 1000 FROM unnest(%(assets)s::bigint[]) a WHERE p.shape = 'FUNDING'
    UNION ALL SELECT p.customer, a, 1, 1000 FROM unnest(%(assets)s::bigint[]) a WHERE p.shape = 'FUNDING'
    UNION ALL SELECT p.world, p.asset, -1, 100 WHERE p.shape = 'D'
    UNION ALL SELECT p.customer, p.asset, 1, 100 WHERE p.shape = 'D'
    UNION ALL SELECT p.customer, p.asset, -1, 1 WHERE p.shape = 'W'
    UNION ALL SELECT p.world, p.asset, 1, 1 WHERE p.shape = 'W'
    UNION ALL SELECT p.customer, p.asset, -1, 0.5 WHERE p.shape = 'T'
    UNION ALL SELECT p.other, p.asset, 1, 0.5 WHERE p.shape = 'T'
    UNION ALL SELECT p.customer, p.asset, -1, 0.01 WHERE p.shape = 'C'
    UNION ALL SELECT p.liquidity, p.asset, 1, 0.01 WHERE p.shape = 'C'
    UNION ALL SELECT p.liquidity, p.asset2, -1, 1 WHERE p.shape = 'C'
    UNION ALL SELECT p.customer, p.asset2, 1, 1 WHERE p.shape = 'C'
) AS leg(account_id, asset_id, side, amount);
ANALYZE bench_leg;
INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount)
SELECT posting_id, account_id, asset_id, 'F', side, amount FROM bench_leg ORDER BY posting_id;
"""

# The change feed: per posting, account and asset, the deltas and the balance after; seq per account.
CHANGES = """
CREATE TEMP TABLE bench_change AS
SELECT posting_id, kind, created, account_id, asset_id, delta,
    sum(delta) OVER (PARTITION BY account_id, asset_id ORDER BY posting_id) AS free_after,
    row_number() OVER (PARTITION BY account_id ORDER BY posting_id, asset_id) AS seq
FROM (SELECT posting_id, kind, created, account_id, asset_id, sum(side * amount) AS delta
      FROM bench_leg GROUP BY posting_id, kind, created, account_id, asset_id) per_posting;
INSERT INTO accounts_balancechange (account_id, asset_id, posting_id, kind, seq, delta_free, delta_locked,
    free_after, locked_after, created_at, published_at)
SELECT account_id, asset_id, posting_id, kind, seq, delta, 0, free_after, 0, created, created FROM bench_change;
ANALYZE bench_change;
"""

BALANCES = """
INSERT INTO accounts_balance (account_id, asset_id, free, locked, allow_negative, updated_at)
SELECT c.account_id, c.asset_id, sum(c.delta), 0, bool_or(l.allow_negative), max(c.created)
FROM bench_change c JOIN accounts_ledgeraccount l ON l.user_id = c.account_id GROUP BY c.account_id, c.asset_id;
UPDATE accounts_ledgeraccount l SET seq = s.seq FROM (SELECT account_id, max(seq) AS seq FROM bench_change
    GROUP BY account_id) s WHERE l.user_id = s.account_id;
"""

# Temp tables are never analysed by autovacuum: each is analysed once written, or a plan built on
# guessed row counts can take minutes instead of seconds (seen: the counters' join).
# counters.py's rules: free-bucket change of customer accounts (track_limits) per UTC day, month, year.
COUNTERS = """
INSERT INTO accounts_limitcounter (account_id, asset_id, span, period_start, deposits, withdrawals, p2p_in, p2p_out)
SELECT c.account_id, c.asset_id, span.code, span.start,
    sum(CASE WHEN c.kind IN ('CHAIN_DEPOSIT', 'FIAT_DEPOSIT') THEN c.delta ELSE 0 END),
    sum(CASE WHEN c.kind IN ('CHAIN_WITHDRAWAL', 'FIAT_WITHDRAWAL') THEN c.delta ELSE 0 END),
    sum(CASE WHEN c.kind = 'P2P_TRANSFER' AND c.delta > 0 THEN c.delta ELSE 0 END),
    sum(CASE WHEN c.kind = 'P2P_TRANSFER' AND c.delta < 0 THEN -c.delta ELSE 0 END)
FROM bench_change c JOIN accounts_ledgeraccount l ON l.user_id = c.account_id AND l.track_limits
CROSS JOIN LATERAL (VALUES
    ('D', (c.created AT TIME ZONE 'UTC')::date),
    ('M', date_trunc('month', c.created AT TIME ZONE 'UTC')::date),
    ('Y', date_trunc('year', c.created AT TIME ZONE 'UTC')::date)) AS span(code, start)
WHERE c.kind IN ('CHAIN_DEPOSIT', 'FIAT_DEPOSIT', 'CHAIN_WITHDRAWAL', 'FIAT_WITHDRAWAL', 'P2P_TRANSFER')
    AND c.delta <> 0
GROUP BY c.account_id, c.asset_id, span.code, span.start;
"""


def timed_requests(client, url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            sys.exit(f"{url}: HTTP {response.status_code}")
    return times


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    env = _bench.bench_env("bench_dashboard", 6, DASHBOARD_ROLLUP_LAG_SECONDS="60")
    _bench.recreate_database(env)
    setup_django(env)
    from django.contrib.auth.models import Group
    from django.db import connection, transaction
    from django.test import Client
    from django.urls import reverse

    from accounts.ledger.check import ledger_check
    from accounts.ledger.models import Posting
    from accounts.models import User
    from exchange.backoffice.roles import SUPPORT
    from exchange.dashboard import activity

    began = time.perf_counter()
    ids = create_accounts()
    with transaction.atomic(), connection.cursor() as cursor:
        build_journal(cursor, ids)
    build_s = time.perf_counter() - began
    postings = Posting.objects.count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM accounts_entry")
        entries = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM accounts_balance WHERE free < 0 AND NOT allow_negative")
        negative = cursor.fetchone()[0]
    print(
        f"setup: {postings} postings, {entries} entries, {len(ids['customers'])} customers, {len(ASSETS)} assets,"
        f" 30 days; built in {build_s:.0f}s"
    )
    if negative:
        sys.exit(f"{negative} negative customer balances: the journal is not one the service could write")
    began = time.perf_counter()
    check = ledger_check(record=True)
    print(f"ledger_check_ok: {check.ok} ({check.postings} postings, {time.perf_counter() - began:.0f}s)")
    if not check.ok:
        sys.exit("the ledger check failed; the figures are not valid:\n" + check.report())

    staff = User.objects.create_user(email="support@dashboard.bench", password="!", is_staff=True)
    staff.groups.add(Group.objects.get(name=SUPPORT))
    client = Client()
    client.force_login(staff)
    dashboard = reverse("backoffice:dashboard")

    began = time.perf_counter()
    timed_requests(client, dashboard, 1)
    print(
        f"dashboard_first_view_with_fold_ms: {(time.perf_counter() - began) * 1000:.0f}"
        f" (folded {activity.ActivityRollup.objects.get().folded_through} of {postings} posting ids)"
    )
    activity.activity_fold()  # as the periodic task keeps it
    tail = activity.unfolded_postings()
    times = timed_requests(client, dashboard, REQUESTS)
    print(f"dashboard_requests: {REQUESTS} (live tail: {tail} postings)")
    print(f"dashboard_median_ms: {statistics.median(times):.1f}")
    print(f"dashboard_p99_ms: {p99(times):.1f}")
    print(f"dashboard_max_ms: {max(times):.1f}")

    newest = Posting.objects.order_by("-id").values_list("id", flat=True).first()
    samples = []
    for _ in range(5):
        began = time.perf_counter()
        activity.activity_of_postings(after=newest - 20_000)
        samples.append((time.perf_counter() - began) * 1000)
    print(f"tail_20000_postings_aggregate_median_ms: {statistics.median(samples):.1f}")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT account_id FROM accounts_balancechange WHERE account_id = ANY(%s)"
            " GROUP BY account_id ORDER BY count(*) DESC LIMIT 1",
            [ids["customers"]],
        )
        busiest = cursor.fetchone()[0]
    customer_url = reverse("backoffice:customer_detail", args=[busiest])
    times = timed_requests(client, customer_url, REQUESTS)
    print(f"customer_page_median_ms: {statistics.median(times):.1f}")
    print(f"customer_page_p99_ms: {p99(times):.1f}")
    email = f"c{ids['customers'].index(busiest)}%40dashboard.bench"
    search = timed_requests(client, reverse("backoffice:customer") + f"?q={email}", REQUESTS)
    print(f"customer_search_median_ms: {statistics.median(search):.1f}")
    median = statistics.median(timed_requests(client, dashboard, REQUESTS))
    print(f"target_ms: {TARGET_MS:.0f}")
    print(f"headline: {median:.1f}")


if __name__ == "__main__":
    main()
