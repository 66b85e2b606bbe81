"""The ledger under real concurrency (DESIGN.md section 3): threads, each with its own PostgreSQL
connection, posting at once. Rows are locked in id order, so no posting may ever fail with a
deadlock; debits are checked under the lock, so no balance may go negative; the ledger check must
pass after every scenario."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import IntegrityError, OperationalError, connection

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.models import Asset, Balance, BalanceChange, LedgerAccount, Posting, SystemRole
from exchange.api.errors import InsufficientBalance

pytestmark = pytest.mark.django_db(transaction=True)

ASSETS = ("BTC", "ETH")


@pytest.fixture
def assets(db):
    return [Asset.objects.create(code=code, name=code, transfer_precision=8) for code in ASSETS]


def run_threads(count: int, work: Callable[[int], None], timeout: float = 120) -> list[BaseException]:
    """Start `count` threads together (a barrier), each running work(index) on its own database
    connection; return the exceptions that escaped `work`."""
    barrier = threading.Barrier(count)
    escaped: list[BaseException] = []

    def runner(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as exc:
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
        assert LedgerAccount.objects.get(user_id=account_id).seq == len(rows)
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
            except Exception as exc:
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
            except Exception as exc:
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
        except Exception as exc:
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


def test_first_postings_of_new_accounts_concurrently_never_deadlock(make_user, assets):
    """Ledger rows are created by an account's first posting. Postings touching several accounts
    that are new (or being created by another posting at that moment) must not deadlock either."""
    sources = [make_user().id for _ in range(THREADS)]
    for source in sources:
        fund(source, "BTC", Decimal(1000), f"fund:{source}")
    fresh = [make_user().id for _ in range(300)]
    lock = threading.Lock()
    outcomes = Counter()
    unexpected: list[BaseException] = []

    def work(index: int) -> None:
        rng = random.Random(7000 + index)
        source = sources[index]
        for n in range(120):
            a, b = rng.sample(fresh, 2)
            legs = [
                ledger.Leg(source, "BTC", Decimal("-0.02")),
                ledger.Leg(a, "BTC", Decimal("0.01")),
                ledger.Leg(b, "BTC", Decimal("0.01")),
            ]
            try:
                ledger.post(legs=legs, kind="DISTRIBUTION", reference=f"new:{index}:{n}")
            except Exception as exc:
                with lock:
                    unexpected.append(exc)
            else:
                with lock:
                    outcomes["ok"] += 1

    escaped = run_threads(THREADS, work)

    assert not escaped, escaped
    deadlocks = [exc for exc in unexpected if is_deadlock(exc)]
    assert not deadlocks, f"{len(deadlocks)} of {THREADS * 120} postings deadlocked, first: {deadlocks[0]!r}"
    assert not unexpected, f"{len(unexpected)} unexpected errors, first: {unexpected[0]!r}"
    assert outcomes["ok"] == THREADS * 120
    check = ledger_check()
    assert check.ok, check.report()
    assert_change_feed_consistent(fresh)
