"""The ledger check: recompute every balance from the journal; every posting and the whole book
must sum to zero per asset. Read-only; safe to run at any time (one REPEATABLE READ snapshot on
PostgreSQL, so postings committed meanwhile do not show as drift)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import connection, transaction
from django.utils import timezone

from accounts.ledger.counters import COUNTED, from_journal, period_keys
from accounts.ledger.models import LedgerCheckRun
from accounts.ledger.posting import decimal_from_db


@dataclass
class CheckResult:
    postings: int = 0
    balances: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> str:
        head = f"{self.postings} postings, {self.balances} balances: "
        if self.ok:
            return head + (
                "OK (every balance and limit counter equals its journal, every posting and the book sum to zero)"
            )
        return head + f"{len(self.problems)} problem(s)\n" + "\n".join(self.problems[:200])


def _sums_in_database(cursor, result: CheckResult) -> dict[tuple[int, int], list[Decimal]]:
    cursor.execute(
        "SELECT e.posting_id, a.code, SUM(e.side * e.amount) FROM accounts_entry e"
        " JOIN accounts_asset a ON a.id = e.asset_id GROUP BY e.posting_id, a.code"
        " HAVING SUM(e.side * e.amount) <> 0 ORDER BY e.posting_id"
    )
    for posting_id, code, total in cursor.fetchall():
        result.problems.append(f"posting #{posting_id} does not sum to zero in {code}: {decimal_from_db(total)}")
    cursor.execute(
        "SELECT a.code, SUM(e.side * e.amount) FROM accounts_entry e JOIN accounts_asset a ON a.id = e.asset_id"
        " GROUP BY a.code HAVING SUM(e.side * e.amount) <> 0"
    )
    for code, total in cursor.fetchall():
        result.problems.append(f"the book does not sum to zero in {code}: {decimal_from_db(total)}")
    cursor.execute(
        "SELECT account_id, asset_id, bucket, SUM(side * amount) FROM accounts_entry"
        " GROUP BY account_id, asset_id, bucket"
    )
    journal: dict[tuple[int, int], list[Decimal]] = {}
    for account, asset, bucket, total in cursor.fetchall():
        journal.setdefault((account, asset), [Decimal(0), Decimal(0)])[0 if bucket == "F" else 1] = decimal_from_db(
            total
        )
    return journal


def _sums_in_python(cursor, result: CheckResult) -> dict[tuple[int, int], list[Decimal]]:
    cursor.execute(
        "SELECT e.posting_id, e.account_id, e.asset_id, a.code, e.bucket, e.side, e.amount FROM accounts_entry e"
        " JOIN accounts_asset a ON a.id = e.asset_id ORDER BY e.posting_id"
    )
    per_posting: dict[tuple[int, str], Decimal] = defaultdict(Decimal)
    book: dict[str, Decimal] = defaultdict(Decimal)
    journal: dict[tuple[int, int], list[Decimal]] = {}
    for posting_id, account, asset, code, bucket, side, amount in cursor.fetchall():
        signed = decimal_from_db(amount) * side
        per_posting[(posting_id, code)] += signed
        book[code] += signed
        journal.setdefault((account, asset), [Decimal(0), Decimal(0)])[0 if bucket == "F" else 1] += signed
    for (posting_id, code), total in per_posting.items():
        if total != 0:
            result.problems.append(f"posting #{posting_id} does not sum to zero in {code}: {total}")
    for code, total in book.items():
        if total != 0:
            result.problems.append(f"the book does not sum to zero in {code}: {total}")
    return journal


def journal_free_changes(cursor, since=None) -> list[tuple[int, int, str, datetime, Decimal]]:
    """Per posting that counts against limits, each customer account's net free change per asset:
    (account, asset id, kind, posting time, signed amount), the input of counters.from_journal."""
    kinds = sorted(COUNTED)
    cursor.execute(
        "SELECT e.account_id, e.asset_id, p.kind, p.created_at, e.side, e.amount FROM accounts_entry e"
        " JOIN accounts_posting p ON p.id = e.posting_id JOIN accounts_ledgeraccount la ON la.user_id = e.account_id"
        " WHERE e.bucket = 'F' AND la.track_limits AND p.kind IN ("
        + ", ".join(["%s"] * len(kinds))
        + ")"
        + (" AND p.created_at >= %s" if since is not None else ""),
        [*kinds, *([since] if since is not None else [])],
    )
    return [
        (account, asset, kind, _datetime(created), decimal_from_db(amount) * side)
        for account, asset, kind, created, side, amount in cursor.fetchall()
    ]


def _datetime(value) -> datetime:
    # SQLite gives raw text to a cursor: the stored UTC time.
    if isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _check_counters(cursor, result: CheckResult, now: datetime) -> None:
    """The stored limit counters of the current day, month and year equal the journal's."""
    periods = period_keys(now)
    year_start = datetime.combine(periods[-1][1], datetime.min.time(), tzinfo=UTC)
    expected = from_journal(journal_free_changes(cursor, since=year_start), periods)
    where = " OR ".join(["(span = %s AND period_start = %s)"] * len(periods))
    cursor.execute(
        "SELECT account_id, asset_id, span, period_start, deposits, withdrawals, p2p_in, p2p_out"
        f" FROM accounts_limitcounter WHERE {where}",
        [v for key in periods for v in key],
    )
    stored = {}
    for account, asset, span, start, *values in cursor.fetchall():
        start = start if isinstance(start, date) else date.fromisoformat(str(start))
        stored[(account, asset, span, start)] = [decimal_from_db(v) for v in values]
    zero = [Decimal(0)] * 4
    for key in sorted(set(stored) | set(expected), key=str):
        if stored.get(key, zero) != expected.get(key, zero):
            account, asset, span, start = key
            result.problems.append(
                f"account {account} asset {asset}: limit counter {span} {start} is {stored.get(key, zero)},"
                f" journal gives {expected.get(key, zero)} (deposits, withdrawals, p2p in, p2p out)"
            )


def ledger_check(*, record: bool = False) -> CheckResult:
    started = timezone.now()
    result = CheckResult()
    own_transaction = not connection.in_atomic_block
    with transaction.atomic():
        cursor = connection.cursor()
        if own_transaction and connection.vendor == "postgresql":
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("SELECT COUNT(*) FROM accounts_posting")
        result.postings = cursor.fetchone()[0]

        if connection.vendor == "postgresql":
            journal = _sums_in_database(cursor, result)
        else:
            # SQLite sums NUMERIC columns as floating point: add the Decimals here instead.
            journal = _sums_in_python(cursor, result)

        cursor.execute(
            "SELECT b.account_id, b.asset_id, a.code, b.free, b.locked FROM accounts_balance b"
            " JOIN accounts_asset a ON a.id = b.asset_id"
        )
        seen = set()
        for account, asset, code, free, locked in cursor.fetchall():
            result.balances += 1
            seen.add((account, asset))
            expected = journal.get((account, asset), [Decimal(0), Decimal(0)])
            stored = [decimal_from_db(free), decimal_from_db(locked)]
            if stored != expected:
                result.problems.append(
                    f"account {account} {code}: balance free={stored[0]} locked={stored[1]}, "
                    f"journal free={expected[0]} locked={expected[1]}"
                )
        for (account, asset), expected in journal.items():
            if (account, asset) not in seen and any(expected):
                result.problems.append(f"account {account} asset {asset}: journal {expected} but no balance row")
        _check_counters(cursor, result, timezone.now())
    if record:
        LedgerCheckRun.objects.create(
            started_at=started,
            finished_at=timezone.now(),
            ok=result.ok,
            postings=result.postings,
            balances=result.balances,
            report=result.report(),
        )
    return result
