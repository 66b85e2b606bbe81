"""Transfers under real concurrency on PostgreSQL: real threads, each with its own database
connection (closed at the thread's end), committing for real (transaction=True).

- 1,000 transfers in a ring of 20 accounts (i sends to i+1) from 16 threads: only InsufficientBalance
  may refuse one (the amounts can run an account short), money is conserved, every balance equals
  its start plus what the Transfer rows say it received minus what it sent, the ledger check passes,
  and nothing waits on a lock for long (no deadlock);
- the same with a fee, so every posting also touches the fees account;
- two accounts sending to each other at once (the classic lock-order deadlock);
- the same client_transfer_id sent 50 times at once through the HTTP API moves money once;
- 60 transfers at once against a daily limit that admits 20: exactly 20 pass (limit check and
  counters under the sender's lock).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connections, transaction

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.models import Asset, BusinessType, Posting
from accounts.models import Balance, LimitPeriod, LimitTier, SystemRole, TierLimit, User
from exchange.api.errors import ExchangeError
from tests.support.assertions import assert_error
from tests.support.client import SignedClient, now_ms
from tests.support.waiting import wait_until
from wallet.models import Transfer, TransferFee
from wallet.transfers import services

pytestmark = pytest.mark.django_db(transaction=True)

ASSET = "RING"
THREADS = 16
DEADLINE_SECONDS = 150


@pytest.fixture
def ring_asset(db):
    return Asset.objects.create(
        code=ASSET, name="Ring test coin", transfer_precision=2, transfer_min_quantity=Decimal(1), reference_price=1
    )


@pytest.fixture
def roomy_tier(db):
    """Limits are checked on every transfer (from the limit counters) but never reached here."""
    tier = LimitTier.objects.create(name="roomy", currency=ASSET)
    big = Decimal(10**12)
    for period in LimitPeriod.values:
        TierLimit.objects.create(
            tier=tier, period=period, cash_in_limit=big, cash_out_limit=big, total_withdraw_limit=big
        )
    return tier


def make_accounts(make_user, tier, count: int, funds: Decimal, prefix: str) -> list[User]:
    users = [make_user(email=f"{prefix}{i}@ring.test", phone=f"+63900{i:07d}" if i % 2 else None) for i in range(count)]
    for user in users:
        user.limit_tier = tier
        user.save()
    equity = ledger.system_account_id(SystemRole.EQUITY)
    legs = [ledger.Leg(equity, ASSET, -funds * count)] + [ledger.Leg(u.pk, ASSET, funds) for u in users]
    ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference=f"test:{prefix}:funding")
    return users


def free_of(account_id: int) -> Decimal:
    row = Balance.objects.filter(account_id=account_id, asset__code=ASSET).first()
    return row.free if row else Decimal(0)


def run_transfers(jobs: list[tuple[int, int, Decimal, str]], users: list[User], threads: int = THREADS):
    """jobs: (sender index, recipient index, amount, client id). Returns (outcomes, errors, slowest)."""
    work: queue.Queue = queue.Queue()
    for job in jobs:
        work.put(job)
    outcomes: Counter = Counter()
    errors: list[str] = []
    slowest = [0.0]
    lock = threading.Lock()
    ids = [u.pk for u in users]
    addresses = [u.phone or u.email for u in users]
    start = threading.Barrier(threads)

    def worker():
        try:
            own = User.objects.in_bulk(ids)  # this thread's instances, on this thread's connection
            start.wait()
            while True:
                try:
                    sender, recipient, amount, client_id = work.get_nowait()
                except queue.Empty:
                    return
                began = time.perf_counter()
                try:
                    services.transfer_create(
                        sender=own[ids[sender]],
                        asset_code=ASSET,
                        target_address=addresses[recipient],
                        amount=amount,
                        client_transfer_id=client_id,
                    )
                    outcome = "ok"
                except InsufficientBalance:
                    outcome = "insufficient"
                except Exception as exc:  # noqa: BLE001 - anything else fails the test
                    outcome = "error"
                    with lock:
                        errors.append(f"{client_id}: {type(exc).__name__}: {exc}")
                took = time.perf_counter() - began
                with lock:
                    outcomes[outcome] += 1
                    slowest[0] = max(slowest[0], took)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=worker, name=f"transfer-{i}") for i in range(threads)]
    for thread in pool:
        thread.start()
    deadline = time.monotonic() + DEADLINE_SECONDS
    for thread in pool:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread.name for thread in pool if thread.is_alive()]
    assert not stuck, f"threads still running after {DEADLINE_SECONDS}s (deadlock?): {stuck}"
    return outcomes, errors, slowest[0]


def assert_books(users: list[User], funds: Decimal, fee: Decimal = Decimal(0)) -> None:
    """Every balance is its start plus received minus sent (amount + fee), per the Transfer rows."""
    expected = {u.pk: funds for u in users}
    fees_total = Decimal(0)
    for sender, recipient, amount, charged in Transfer.objects.values_list("sender", "recipient", "amount", "fee"):
        expected[sender] -= amount + charged
        expected[recipient] += amount
        fees_total += charged
    actual = {u.pk: free_of(u.pk) for u in users}
    assert actual == expected
    assert all(value >= 0 for value in actual.values())
    assert sum(actual.values()) + fees_total == funds * len(users)
    assert fees_total == fee * Transfer.objects.count()
    check = ledger_check()
    assert check.ok, check.problems


def test_ring_of_20_with_1000_concurrent_transfers(make_user, ring_asset, roomy_tier):
    funds = Decimal(100)
    users = make_accounts(make_user, roomy_tier, 20, funds, "ring")
    rng = random.Random(20261122)
    jobs = [(k % 20, (k + 1) % 20, Decimal(rng.randint(1, 30)), f"ring-{k}") for k in range(1000)]
    started = time.perf_counter()
    outcomes, errors, slowest = run_transfers(jobs, users)
    elapsed = time.perf_counter() - started
    assert errors == []
    assert outcomes["ok"] + outcomes["insufficient"] == 1000
    assert outcomes["ok"] > 500, outcomes  # the amounts run short sometimes, not mostly
    assert Transfer.objects.count() == outcomes["ok"]
    assert Posting.objects.filter(kind=BusinessType.P2P_TRANSFER).count() == outcomes["ok"]
    assert_books(users, funds)
    # No lock pile-up. (A ring of 20 from 16 threads cannot close a lock cycle even with the sender-first
    # lock order: that takes 20 transfers in flight; the pair and fee tests below can.)
    assert slowest < 30, f"slowest transfer took {slowest:.1f}s (of {elapsed:.1f}s)"


def test_ring_with_a_fee_touching_the_fees_account(make_user, ring_asset, roomy_tier):
    fee = Decimal("0.5")
    TransferFee.objects.create(asset=ring_asset, fee=fee)
    fees = ledger.role_account_ids(SystemRole.FEES)  # the sender's shard takes each fee
    funds = Decimal(60)
    users = make_accounts(make_user, roomy_tier, 20, funds, "feering")
    rng = random.Random(7)
    jobs = [(k % 20, (k + 1) % 20, Decimal(rng.randint(1, 20)), f"fee-{k}") for k in range(200)]
    outcomes, errors, _ = run_transfers(jobs, users)
    assert errors == [], f"{len(errors)} of 200 failed (PostgreSQL broke lock-order deadlocks), e.g. {errors[:1]}"
    assert outcomes["ok"] + outcomes["insufficient"] == 200
    assert sum(free_of(shard) for shard in fees) == fee * outcomes["ok"]
    for shard in fees:  # each shard holds the fees of its own senders' transfers
        sent = Transfer.objects.filter(sender__in=[u.pk for u in users if fees[u.pk % len(fees)] == shard]).count()
        assert free_of(shard) == fee * sent, shard
    assert_books(users, funds, fee)


def test_two_accounts_sending_to_each_other_at_once(make_user, ring_asset, roomy_tier):
    """A->B and B->A in flight together must not deadlock: every posting must lock the ledger rows
    of its accounts in one global order."""
    funds = Decimal(1000)
    users = make_accounts(make_user, roomy_tier, 2, funds, "pair")
    jobs = [(k % 2, (k + 1) % 2, Decimal(1), f"pair-{k}") for k in range(200)]
    outcomes, errors, _ = run_transfers(jobs, users)
    assert errors == [], f"{len(errors)} of 200 failed (PostgreSQL broke lock-order deadlocks), e.g. {errors[:1]}"
    assert outcomes["ok"] == 200
    assert_books(users, funds)


def test_same_client_transfer_id_50_times_at_once_moves_money_once(make_user, make_key, ring_asset, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    sender = make_user(email="twin-sender@ring.test")
    recipient = make_user(email="twin-recipient@ring.test")
    equity = ledger.system_account_id(SystemRole.EQUITY)
    ledger.post(
        legs=ledger.move(equity, sender.pk, ASSET, Decimal(1000)), kind=BusinessType.DISTRIBUTION, reference="twin"
    )
    api_key, secret = make_key(sender)
    count = 50
    stamp = now_ms()
    barrier = threading.Barrier(count)
    responses: list = [None] * count

    def send(i: int) -> None:
        try:
            client = SignedClient(api_key.key, secret)  # its own django.test.Client
            barrier.wait()
            responses[i] = client.post(
                "/openapi/transfer/v4/transfers",
                {
                    "account": ASSET,
                    "target_address": recipient.email,
                    "amount": "7",
                    "client_transfer_id": "the-same-id",
                    "recvWindow": 60000,
                },
                timestamp=stamp - i,  # each request signed anew (an identical one is refused as a replay)
            )
        finally:
            connections.close_all()

    pool = [threading.Thread(target=send, args=(i,)) for i in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(DEADLINE_SECONDS)
    assert not any(thread.is_alive() for thread in pool)
    statuses = Counter(r.status_code for r in responses)
    codes = Counter(r.json().get("code") for r in responses if r.status_code != 200)
    assert statuses == {200: 1, 400: 49}, (statuses, codes)
    assert codes == {-1010: 49}
    for response in responses:
        assert response["Content-Type"] == "application/json"
    assert Transfer.objects.filter(sender=sender).count() == 1
    assert free_of(sender.pk) == Decimal(993)
    assert free_of(recipient.pk) == Decimal(7)
    assert Posting.objects.filter(kind=BusinessType.P2P_TRANSFER).count() == 1
    assert ledger_check().ok


def test_same_client_transfer_id_through_the_service_at_once(make_user, ring_asset, roomy_tier):
    """The service directly, 32 twins at once: one Transfer; the others refused with -1010."""
    users = make_accounts(make_user, roomy_tier, 2, Decimal(100), "svc")
    barrier = threading.Barrier(32)
    results: list = [None] * 32

    def send(i: int) -> None:
        try:
            sender = User.objects.get(pk=users[0].pk)
            barrier.wait()
            try:
                services.transfer_create(
                    sender=sender,
                    asset_code=ASSET,
                    target_address=users[1].email,
                    amount=Decimal(3),
                    client_transfer_id="twin",
                )
                results[i] = "ok"
            except ExchangeError as exc:
                results[i] = exc.code
            except Exception as exc:  # noqa: BLE001 - reported in the assertion
                results[i] = f"{type(exc).__name__}: {exc}"
        finally:
            connections.close_all()

    pool = [threading.Thread(target=send, args=(i,)) for i in range(32)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(DEADLINE_SECONDS)
    assert Counter(results) == {"ok": 1, -1010: 31}
    assert Transfer.objects.count() == 1
    assert_books(users, Decimal(100))


def test_concurrent_transfers_never_exceed_the_daily_limit(make_user, ring_asset):
    """A p2p daily cash-out limit of 100 RING; 60 transfers of 5 from one sender at once (300 in
    all, with plenty of balance): the check and the counter update happen under the sender's lock,
    so exactly 20 pass, the 40 others are refused as over the limit, and the counters agree with
    the journal."""
    tier = LimitTier.objects.create(name="tight", currency=ASSET)
    big = Decimal(10**12)
    for period in LimitPeriod.values:
        cash_out = Decimal(100) if period == LimitPeriod.P2P_DAILY else big
        TierLimit.objects.create(
            tier=tier, period=period, cash_in_limit=big, cash_out_limit=cash_out, total_withdraw_limit=big
        )
    users = make_accounts(make_user, tier, 4, Decimal(10_000), "lim")
    jobs = [(0, 1 + i % 3, Decimal(5), f"lim-{i}") for i in range(60)]
    work, refused = list(jobs), Counter()
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def worker():
        try:
            sender = User.objects.get(pk=users[0].pk)
            start.wait()
            while True:
                with lock:
                    if not work:
                        return
                    _, recipient, amount, client_id = work.pop()
                try:
                    services.transfer_create(
                        sender=sender,
                        asset_code=ASSET,
                        target_address=users[recipient].email,
                        amount=amount,
                        client_transfer_id=client_id,
                    )
                    outcome = "ok"
                except ExchangeError as exc:
                    outcome = f"{exc.code} {exc.msg}"
                with lock:
                    refused[outcome] += 1
        finally:
            connections.close_all()

    pool = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(DEADLINE_SECONDS)
    assert refused["ok"] == 20, refused
    assert sum(n for outcome, n in refused.items() if outcome.startswith("-1010") and "limit" in outcome) == 40, refused
    assert Transfer.objects.filter(sender=users[0]).count() == 20
    assert free_of(users[0].pk) == Decimal(10_000 - 100)
    check = ledger_check()
    assert check.ok, check.problems


def _waiting_on_a_lock() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def test_an_id_in_flight_answers_an_unknown_address_as_a_registered_one(make_user, make_key, ring_asset, settings):
    """Issue 34, finding 7, at once: while the sender's transfer with an id is being posted (its
    transaction holds the sender's ledger lock), a request with the same id to an unknown address
    waits for it, as one to a registered address waits in its posting, and is refused as a
    duplicate (-1010) like it, never -1151."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    sender = make_user(email="inflight-sender@ring.test")
    friend = make_user(email="inflight-friend@ring.test")
    equity = ledger.system_account_id(SystemRole.EQUITY)
    ledger.post(
        legs=ledger.move(equity, sender.pk, ASSET, Decimal(100)), kind=BusinessType.DISTRIBUTION, reference="inflight"
    )
    api_key, secret = make_key(sender)
    posted, release = threading.Event(), threading.Event()
    answers: list = []

    def first() -> None:
        try:
            with transaction.atomic():  # the posting's lock is held until this commits
                services.transfer_create(
                    sender=User.objects.get(pk=sender.pk),
                    asset_code=ASSET,
                    target_address=friend.email,
                    amount=Decimal(5),
                    client_transfer_id="in-flight",
                )
                posted.set()
                release.wait(DEADLINE_SECONDS)
        finally:
            connections.close_all()

    def probe() -> None:
        try:
            answers.append(
                SignedClient(api_key.key, secret).post(
                    "/openapi/transfer/v4/transfers",
                    {
                        "account": ASSET,
                        "target_address": "nobody-at-all@ring.test",
                        "amount": "5",
                        "client_transfer_id": "in-flight",
                    },
                )
            )
        finally:
            connections.close_all()

    pool = [threading.Thread(target=first)]
    pool[0].start()
    try:
        wait_until(posted.is_set, what="the first transfer posted, not committed")
        pool.append(threading.Thread(target=probe))
        pool[1].start()
        wait_until(lambda: answers or _waiting_on_a_lock(), what="the probe answered or waiting on the lock")
    finally:
        release.set()
        for thread in pool:
            thread.join(DEADLINE_SECONDS)
    assert not any(thread.is_alive() for thread in pool)
    transfer = Transfer.objects.get(sender=sender, client_transfer_id="in-flight")
    assert_error(
        answers[0],
        -1010,
        400,
        f"Duplicate client_transfer_id: it was already used on this account by transfer {transfer.pk}.",
    )
    assert free_of(sender.pk) == Decimal(95)
    assert ledger_check().ok
