"""The journal-backed list endpoint on a journal of 1,000,000 postings (issue 18, item 4): the asset
transaction history (GET /openapi/v1/asset/transaction/history, the only list endpoint that reads
the postings and entries), for the busiest customer, through the Django test client with a signed
request: the first page, the deepest page the parameters allow (pageNum 1000 x pageSize 100), and
each SQL statement it runs under EXPLAIN (ANALYZE, BUFFERS): the plan must use an index, never a
sequential scan of the journal.

The journal is bench/dashboard's (same builder, a database of its own: bench_list_endpoints).
BENCH_POSTINGS (1,000,000), BENCH_CUSTOMERS (20,000), BENCH_REQUESTS (20).

headline: first page median ms.
"""

import os
import statistics
import time

from bench import _bench, dashboard
from harness import client

REQUESTS = int(os.environ.get("BENCH_REQUESTS", "20"))
PATH = "/openapi/v1/asset/transaction/history"


def main() -> None:
    env = _bench.bench_env(
        "bench_list_endpoints", int(os.environ.get("BENCH_REDIS_DB", "6")), IP_WEIGHT_LIMIT_PER_MINUTE="1000000000"
    )
    env["UID_WEIGHT_LIMIT_PER_MINUTE"] = "1000000000"
    _bench.recreate_database(env)
    dashboard.setup_django(env)
    from django.db import connection, transaction
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from accounts import services as account_services
    from accounts.models import User

    began = time.perf_counter()
    ids = dashboard.create_accounts()
    with transaction.atomic(), connection.cursor() as cursor:
        dashboard.build_journal(cursor, ids)
        cursor.execute("ANALYZE")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM accounts_posting")
        postings = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM accounts_entry")
        entries = cursor.fetchone()[0]
        cursor.execute(
            "SELECT e.account_id, a.code, count(*) FROM accounts_entry e JOIN accounts_asset a ON a.id = e.asset_id"
            " WHERE e.account_id = ANY(%s) GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 1",
            [ids["customers"]],
        )
        busiest, asset, rows = cursor.fetchone()
    print(f"setup: {postings} postings, {entries} entries, built in {time.perf_counter() - began:.0f}s")
    user = User.objects.get(pk=busiest) if User.objects.filter(pk=busiest).exists() else None
    if user is None:  # entries name ledger accounts: find the user behind it
        from accounts.models import LedgerAccount

        user = LedgerAccount.objects.get(pk=busiest).user
    print(f"busiest customer: user {user.pk}, {rows} entries in {asset}")
    created = account_services.api_key_create(user=user, name="bench", types=None, ip_list=None, ip_restrict=None)
    signer = client.Signer(created.api_key.key, created.secret)
    django_client = Client()

    def get(path: str, params: dict):
        """A signed GET through the whole Django stack in this process (as a connector signs it)."""
        headers = {"X-SERVICE-APIKEY": signer.api_key}
        return django_client.get(f"{path}?{signer.signed(params)}", headers=headers, REMOTE_ADDR="127.0.0.1")

    now_ms = int(time.time() * 1000)
    cases = {
        "first page (pageSize 100), last 7 days": {"tokenId": asset, "pageSize": "100"},
        "deepest page (pageNum 1000, pageSize 100), 7 days from 30 days ago": {
            "tokenId": asset,
            "pageNum": "1000",
            "pageSize": "100",
            "startTime": str(now_ms - 30 * 86_400_000),
        },
    }
    for name, params in cases.items():
        times = []
        for _ in range(REQUESTS):
            t0 = time.perf_counter()
            response = get(PATH, params)
            times.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, response.content[:300]
        count = len(response.json().get("transactions", []))
        print(
            f"{name}: {count} rows; median {statistics.median(times):.1f} ms, max {max(times):.1f} ms over {REQUESTS}"
        )
        with CaptureQueriesContext(connection) as queries:
            get(PATH, params)
        for query in queries.captured_queries:
            sql = query["sql"]
            if "accounts_entry" not in sql and "accounts_posting" not in sql and "balancechange" not in sql:
                continue
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plan = [row[0] for row in cursor.fetchall()]
            print(f"  SQL: {sql[:400]}")
            for line in plan:
                print(f"    {line}")
            if any("Seq Scan on accounts_entry" in line or "Seq Scan on accounts_posting" in line for line in plan):
                print("  SEQUENTIAL SCAN OF THE JOURNAL")
    house_history(connection)
    if name:
        print(f"headline: {statistics.median(times):.1f}")


def house_history(connection) -> None:
    """The busiest ledger account of the journal (a house shard, thousands of entries in one asset):
    its last 7 days and 7 days from 30 days ago through accounts.selectors.transaction_history, with
    the posting-id bounds and, in the same run, without them (what the history did before)."""
    from datetime import timedelta

    from django.utils import timezone

    from accounts import selectors
    from accounts.models import Asset, User

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT account_id, asset_id, count(*) FROM accounts_entry GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 1"
        )
        account_id, asset_id, rows = cursor.fetchone()
    user, asset = User.objects.get(pk=account_id), Asset.objects.get(pk=asset_id)
    print(f"busiest ledger account: {user.pk} ({user.system_role or 'customer'}), {rows} entries in {asset.code}")
    now = timezone.now()
    windows = {
        "last 7 days": (now - timedelta(days=7), now),
        "7 days from 30 days ago": (now - timedelta(days=30), now - timedelta(days=23)),
    }
    unbounded = lambda start, end, using="default": (None, None)  # noqa: E731 - the history before the bounds
    for name, (start, end) in windows.items():
        figures = {}
        for label, bounds in (("bounded", selectors.posting_id_bounds), ("unbounded", unbounded)):
            selectors.posting_id_bounds, kept = bounds, selectors.posting_id_bounds
            try:
                times = []
                for _ in range(REQUESTS):
                    t0 = time.perf_counter()
                    page = selectors.transaction_history(user=user, asset=asset, start=start, end=end, page=1, size=100)
                    times.append((time.perf_counter() - t0) * 1000)
            finally:
                selectors.posting_id_bounds = kept
            figures[label] = (statistics.median(times), len(page.rows))
        (bounded, rows_b), (plain, rows_u) = figures["bounded"], figures["unbounded"]
        assert rows_b == rows_u, (name, rows_b, rows_u)
        print(
            f"house account, {name}, first page: {rows_b} rows; median {bounded:.1f} ms with the posting-id bounds,"
            f" {plain:.1f} ms without ({plain / bounded:.1f}x)"
        )


if __name__ == "__main__":
    main()
