"""The ledger under real concurrency (docs/architecture.md section 3): threads, each with its own PostgreSQL
connection, posting at once. Rows are locked in id order, so no posting may ever fail with a
deadlock; debits are checked under the lock, so no balance may go negative; the ledger check must
pass after every scenario."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import IntegrityError, OperationalError, connection

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.errors import InsufficientBalance
from accounts.models import Asset, Balance, BalanceChange, LedgerAccount, Posting, SystemRole

pytestmark = pytest.mark.django_db(transaction=True)

ASSETS = ("BTC", "ETH")


@pytest.fixture
def assets(db):
    return [Asset.objects.create(code=code, name=code, transfer_precision=8) for code in ASSETS]


def run_threads(count: int, work: Callable[[int], None], timeout: float = 240) -> list[BaseException]:
    """Start `count` threads together (a barrier), each running work(index) on its own database
    connection; return the exceptions that escaped `work`."""
    barrier = threading.Barrier(count)
    escaped: list[BaseException] = []

    def runner(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on any
            escaped.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=(i,), name=f"ledger-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck (lock wait?)"
    return escaped


def is_deadlock(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {type(exc.__cause__).__name__} {exc}".lower()
    return "deadlock" in text


def fund(account_id: int, code: str, amount: Decimal, reference: str) -> None:
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, account_id, code, amount), kind="CHAIN_DEPOSIT", reference=reference)


def balance(account_id: int, code: str) -> tuple[Decimal, Decimal]:
    row = Balance.objects.filter(account_id=account_id, asset__code=code).first()
    return (row.free, row.locked) if row else (Decimal(0), Decimal(0))


def assert_change_feed_consistent(account_ids) -> None:
    """Per account: seq 1..n without gaps (and the ledger row's seq is n); per account and asset:
    the last change row's free/locked after equal the balance, and the deltas sum to it."""
    for account_id in account_ids:
        rows = list(
            BalanceChange.objects.filter(account_id=account_id)
            .order_by("seq")
            .values_list("seq", "asset__code", "delta_free", "delta_locked", "free_after", "locked_after")
        )
        seqs = [row[0] for row in rows]
        assert seqs == list(range(1, len(rows) + 1)), f"account {account_id}: seq gaps {seqs[:20]}..."
        seq = LedgerAccount.objects.filter(user_id=account_id).values_list("seq", flat=True).first()
        assert (seq or 0) == len(rows), f"account {account_id}: ledger seq {seq}, {len(rows)} change rows"
        last: dict[str, tuple[Decimal, Decimal]] = {}
        sums: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
        for _, code, delta_free, delta_locked, free_after, locked_after in rows:
            sums[code][0] += delta_free
            sums[code][1] += delta_locked
            assert (free_after, locked_after) == (sums[code][0], sums[code][1]), (account_id, code)
            last[code] = (free_after, locked_after)
        for code, after in last.items():
            assert balance(account_id, code) == after, (account_id, code)


def random_amount(rng: random.Random, maximum: int) -> Decimal:
    """0.00000001 .. maximum, up to 8 decimal places."""
    return Decimal(rng.randint(1, maximum * 10**8)).scaleb(-8)


# --- many random postings --------------------------------------------------------------------------

THREADS = 16
POSTINGS = 5000
CUSTOMERS = 10
FUNDING = Decimal(5)


def test_random_postings_from_16_threads_keep_the_book_exact(make_user, assets):
    customers = [make_user().id for _ in range(CUSTOMERS)]
    world = ledger.system_account_id(SystemRole.WORLD)
    funded = Counter()
    for account_id in customers:
        for code in ASSETS:
            fund(account_id, code, FUNDING, f"fund:{account_id}:{code}")
            funded[code] += FUNDING
    fundings = Posting.objects.count()

    ok = Counter()
    refused = Counter()
    unexpected: list[BaseException] = []
    tally = threading.Lock()

    def work(index: int) -> None:
        rng = random.Random(1000 + index)
        count = POSTINGS // THREADS + (1 if index < POSTINGS % THREADS else 0)
        for n in range(count):
            code = rng.choice(ASSETS)
            a, b = rng.sample(customers, 2)
            shape = rng.choices(["move", "hold", "release", "settle"], weights=[4, 2, 2, 2])[0]
            amount = random_amount(rng, 4)
            if shape == "move":
                legs = ledger.move(a, b, code, amount)
            elif shape == "hold":
                legs = ledger.hold(a, code, amount)
            elif shape == "release":
                legs = ledger.release(a, code, amount)
            else:
                legs = ledger.settle(a, b, code, amount)
            try:
                ledger.post(legs=legs, kind="P2P_TRANSFER", reference=f"rnd:{index}:{n}")
            except InsufficientBalance:
                with tally:
                    refused[shape] += 1
            except Exception as exc:  # noqa: BLE001 - collected; the test asserts there are none
                with tally:
                    unexpected.append(exc)
            else:
                with tally:
                    ok[shape] += 1

    escaped = run_threads(THREADS, work)

    assert not escaped, escaped
    deadlocks = [exc for exc in unexpected if is_deadlock(exc) or isinstance(exc, OperationalError)]
    assert not deadlocks, f"{len(deadlocks)} deadlock/operational errors, first: {deadlocks[0]!r}"
    assert not unexpected, f"{len(unexpected)} unexpected errors, first: {unexpected[0]!r}"
    assert sum(ok.values()) + sum(refused.values()) == POSTINGS
    assert sum(refused.values()) > POSTINGS // 10, f"too few refused debits to exercise the check: {refused}"
    assert all(ok[shape] > 50 for shape in ("move", "hold", "release", "settle")), ok

    negative = Balance.objects.filter(account_id__in=customers).exclude(free__gte=0, locked__gte=0)
    assert not negative.exists(), list(negative)
    assert not Balance.objects.filter(locked__lt=0).exists()

    check = ledger_check()
    assert check.ok, check.report()

    for code in ASSETS:
        rows = Balance.objects.filter(account_id__in=customers, asset__code=code)
        assert sum(row.free + row.locked for row in rows) == funded[code], code
        assert balance(world, code) == (-funded[code], Decimal(0))

    assert Posting.objects.count() - fundings == sum(ok.values())
    assert_change_feed_consistent([*customers, world])


# --- one hot account ---------------------------------------------------------------------------------


def test_hot_account_500_concurrent_debits_of_1_with_250_funded(make_user, assets):
    hot = make_user().id
    others = [make_user().id for _ in range(5)]
    fund(hot, "BTC", Decimal(250), "fund:hot")
    attempts = list(range(500))
    lock = threading.Lock()
    outcomes = Counter()
    unexpected: list[BaseException] = []

    def work(index: int) -> None:
        while True:
            with lock:
                if not attempts:
                    return
                n = attempts.pop()
            try:
                ledger.post(
                    legs=ledger.move(hot, others[n % len(others)], "BTC", Decimal(1)),
                    kind="P2P_TRANSFER",
                    reference=f"hot:{n}",
                )
            except InsufficientBalance:
                with lock:
                    outcomes["refused"] += 1
            except Exception as exc:  # noqa: BLE001 - collected; the test asserts there are none
                with lock:
                    unexpected.append(exc)
            else:
                with lock:
                    outcomes["ok"] += 1

    escaped = run_threads(16, work)

    assert not escaped, escaped
    assert not unexpected, f"{len(unexpected)} unexpected errors, first: {unexpected[0]!r}"
    assert outcomes == {"ok": 250, "refused": 250}
    assert balance(hot, "BTC") == (Decimal(0), Decimal(0))
    assert sum(balance(other, "BTC")[0] for other in others) == Decimal(250)
    assert Posting.objects.filter(reference__startswith="hot:").count() == 250
    check = ledger_check()
    assert check.ok, check.report()
    assert_change_feed_consistent([hot, *others])


# --- one reference, twenty threads ------------------------------------------------------------------


def test_same_reference_posted_by_20_threads_moves_money_once(make_user, assets):
    alice, bob = make_user().id, make_user().id
    fund(alice, "BTC", Decimal(100), "fund:alice")
    lock = threading.Lock()
    outcomes = Counter()
    unexpected: list[BaseException] = []

    def work(index: int) -> None:
        try:
            ledger.post(legs=ledger.move(alice, bob, "BTC", Decimal("1.5")), kind="P2P_TRANSFER", reference="p2p:once")
        except IntegrityError:
            with lock:
                outcomes["duplicate"] += 1
        except Exception as exc:  # noqa: BLE001 - collected; the test asserts there are none
            with lock:
                unexpected.append(exc)
        else:
            with lock:
                outcomes["ok"] += 1

    escaped = run_threads(20, work)

    assert not escaped, escaped
    assert not unexpected, unexpected
    assert outcomes == {"ok": 1, "duplicate": 19}
    assert balance(alice, "BTC") == (Decimal("98.5"), Decimal(0))
    assert balance(bob, "BTC") == (Decimal("1.5"), Decimal(0))
    assert Posting.objects.filter(reference="p2p:once").count() == 1
    check = ledger_check()
    assert check.ok, check.report()
    assert_change_feed_consistent([alice, bob])


# --- first postings of brand-new accounts -----------------------------------------------------------


FIRST_POSTINGS_PER_THREAD = 40


def test_first_postings_of_new_accounts_concurrently_never_deadlock(make_user, assets):
    """An account without a ledger row gets one from its first posting. Postings touching several
    such accounts (or ones another posting is creating at that moment) must not deadlock either."""
    sources = [make_user().id for _ in range(THREADS)]
    for source in sources:
        fund(source, "BTC", Decimal(1000), f"fund:{source}")
    fresh = [make_user().id for _ in range(200)]
    # Accounts get their ledger row when created (accounts/apps.py); post() still creates missing
    # ones (users bulk-created or older than the ledger), which is the path exercised here.
    LedgerAccount.objects.filter(user_id__in=fresh).delete()
    lock = threading.Lock()
    outcomes = Counter()
    unexpected: list[BaseException] = []

    def work(index: int) -> None:
        rng = random.Random(7000 + index)
        source = sources[index]
        for n in range(FIRST_POSTINGS_PER_THREAD):
            a, b = rng.sample(fresh, 2)
            legs = [
                ledger.Leg(source, "BTC", Decimal("-0.02")),
                ledger.Leg(a, "BTC", Decimal("0.01")),
                ledger.Leg(b, "BTC", Decimal("0.01")),
            ]
            try:
                ledger.post(legs=legs, kind="DISTRIBUTION", reference=f"new:{index}:{n}")
            except Exception as exc:  # noqa: BLE001 - collected; the test asserts there are none
                with lock:
                    unexpected.append(exc)
            else:
                with lock:
                    outcomes["ok"] += 1

    escaped = run_threads(THREADS, work)

    assert not escaped, escaped
    deadlocks = [exc for exc in unexpected if is_deadlock(exc)]
    assert not deadlocks, (
        f"{len(deadlocks)} of {THREADS * FIRST_POSTINGS_PER_THREAD} postings deadlocked, first: {deadlocks[0]!r}"
    )
    assert not unexpected, f"{len(unexpected)} unexpected errors, first: {unexpected[0]!r}"
    assert outcomes["ok"] == THREADS * FIRST_POSTINGS_PER_THREAD
    check = ledger_check()
    assert check.ok, check.report()
    assert_change_feed_consistent(fresh)


def test_ledger_rows_created_concurrently_by_first_postings_do_not_deadlock(make_user, assets, monkeypatch):
    """A deterministic interleaving of three first postings. post() locks the ledger rows that
    exist, then inserts the missing ones and locks again. So T1 can hold C (locked on its first
    pass, created meanwhile by T3) while waiting for A, which T2 inserted and has not committed,
    while T2 waits to lock C: a lock-order inversion, i.e. a deadlock (PostgreSQL kills one)."""
    from accounts.ledger.posting import api as posting

    s1, s2, s3 = (make_user().id for _ in range(3))
    for source in (s1, s2, s3):
        fund(source, "BTC", Decimal(10), f"fund:{source}")
    a, c = make_user().id, make_user().id
    LedgerAccount.objects.filter(user_id__in=[a, c]).delete()  # as for users bulk-created: no ledger rows yet
    real_lock = posting._lock_accounts
    calls = Counter()
    t2_first_lock_done, t3_committed, t2_inserted, t2_go = (threading.Event() for _ in range(4))

    def lock_accounts(account_ids):
        name = threading.current_thread().name
        calls[name] += 1
        if name == "T2" and calls[name] == 2:  # after inserting the missing rows, before locking again
            t2_inserted.set()
            t2_go.wait(5)
        found = real_lock(account_ids)
        if name == "T2" and calls[name] == 1:
            t2_first_lock_done.set()
            t3_committed.wait(5)
        return found

    monkeypatch.setattr(posting, "_lock_accounts", lock_accounts)
    errors: dict[str, BaseException] = {}

    def post_in_thread(name: str, legs: list) -> threading.Thread:
        def run() -> None:
            try:
                ledger.post(legs=legs, kind="DISTRIBUTION", reference=f"first:{name}")
            except Exception as exc:  # noqa: BLE001 - collected; the test asserts there are none
                errors[name] = exc
            finally:
                connection.close()

        thread = threading.Thread(target=run, name=name)
        thread.start()
        return thread

    split = [ledger.Leg(a, "BTC", Decimal(1)), ledger.Leg(c, "BTC", Decimal(1))]
    t2 = post_in_thread("T2", [ledger.Leg(s2, "BTC", Decimal(-2)), *split])
    assert t2_first_lock_done.wait(10)
    post_in_thread("T3", ledger.move(s3, c, "BTC", Decimal(1))).join(10)  # creates C's ledger row
    t3_committed.set()
    t2_inserted.wait(10)  # T2 holds its uncommitted row for A
    t1 = post_in_thread("T1", [ledger.Leg(s1, "BTC", Decimal(-2)), *split])
    _wait_for_lock_waiters(1)  # T1 locked C, now waits for A
    t2_go.set()
    t1.join(30)
    t2.join(30)

    assert not t1.is_alive()
    assert not t2.is_alive()
    assert not errors, f"first postings failed: { {name: repr(exc) for name, exc in errors.items()} }"
    assert balance(a, "BTC") == (Decimal(2), Decimal(0))
    assert balance(c, "BTC") == (Decimal(3), Decimal(0))
    check = ledger_check()
    assert check.ok, check.report()


def _wait_for_lock_waiters(count: int, seconds: float = 5) -> None:
    """Until `count` other sessions wait for a lock (or the time is up)."""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] >= count:
                return
            time.sleep(0.02)
