"""Sub-account writes under real concurrency on PostgreSQL (real threads, each on its own
connection, committing for real):

- the same clientTranId sent 50 times at once through the HTTP API moves money once;
- sub-account creations racing past the 30th: never more than 30 virtual sub-accounts;
- 1,000 universal transfers from 16 threads at once among a master and its sub-accounts, in every direction: the
  family's total is conserved, every balance equals what the transfer rows say, the ledger check
  passes.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connections

from accounts.models import Balance, User
from subaccounts import services
from subaccounts.models import SubAccountTransfer
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_ledger_balanced
from tests.support.client import SignedClient, now_ms
from tests.support.factories import AssetFactory, UserFactory, customer, fund

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE_SECONDS = 150


def run_at_once(count: int, work) -> list:
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def one(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            results[i] = exc
        finally:
            connections.close_all()

    pool = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(DEADLINE_SECONDS)
    assert not any(thread.is_alive() for thread in pool)
    return results


def free_of(user: User, code: str = "BTC") -> Decimal:
    row = Balance.objects.filter(account=user, asset__code=code).first()
    return row.free if row else Decimal(0)


@pytest.fixture
def family_tx(db):
    AssetFactory(code="BTC")
    return h.family_of("race", master_funding={"BTC": "10"}, sub_funding={"BTC": "10"})


def test_same_client_tran_id_50_times_at_once_moves_money_once(family_tx):
    master = family_tx.master
    stamp = now_ms()

    def send(i: int):
        client = SignedClient(master.api_key.key, master.secret)  # its own django.test.Client
        return client.post(
            h.UNIVERSAL,
            {
                "toEmail": family_tx.sub2.user.email,
                "asset": "BTC",
                "amount": "0.7",
                "clientTranId": "the-same-id",
                "recvWindow": 60000,
            },
            timestamp=stamp - i,  # each request signed anew (an identical one is refused as a replay)
        )

    responses = run_at_once(50, send)
    assert not [r for r in responses if isinstance(r, Exception)], responses
    statuses = Counter(r.status_code for r in responses)
    codes = Counter(r.json().get("code") for r in responses if r.status_code != 200)
    assert statuses == {200: 1, 400: 49}, (statuses, codes)
    assert codes == {-1010: 49}
    assert [r.json() for r in responses if r.status_code == 200] == [
        {"clientTransferId": "the-same-id", "result": True}
    ]
    assert SubAccountTransfer.objects.count() == 1
    assert free_of(master.user) == Decimal("9.3")
    assert free_of(family_tx.sub2.user) == Decimal("0.7")
    assert_ledger_balanced()


def test_creations_racing_past_the_limit_stop_at_30(family_tx):
    master = family_tx.master.user
    for i in range(20):
        UserFactory(email=f"pre{i}@race.test", master=master, is_virtual=True)  # 22 with the family's two

    def create(i: int):
        own = User.objects.get(pk=master.pk)
        try:
            return services.sub_account_create(master=own, email=f"new{i}@race.test")
        except Exception as exc:  # noqa: BLE001 - counted below
            return exc

    results = run_at_once(16, create)
    created = [r for r in results if isinstance(r, User)]
    refused = Counter(type(r).__name__ for r in results if not isinstance(r, User))
    assert len(created) == 8, refused
    assert refused == {"TooManySubAccounts": 8}
    assert User.objects.filter(master=master, is_virtual=True).count() == 30


def test_concurrent_universal_transfers_conserve_the_familys_total():
    AssetFactory(code="BTC")
    master = customer(email="big-master@race.test", funding={"BTC": "100"})
    subs = [UserFactory(email=f"big-sub{i}@race.test", master=master.user, is_virtual=True) for i in range(5)]
    for sub in subs:
        fund(sub, "BTC", "20")
    family = [master.user, *subs]
    total = sum(free_of(u) for u in family)
    rng = random.Random(15)
    jobs = []
    for n in range(1000):
        source, target = rng.sample(range(len(family)), 2)
        jobs.append((source, target, Decimal(rng.randint(1, 900)) / 100, f"job-{n}"))
    threads = 16
    share = [jobs[i::threads] for i in range(threads)]

    def work(i: int):
        own = User.objects.get(pk=master.user.pk)
        emails = [None] + [s.email for s in subs]
        outcomes = Counter()
        for source, target, amount, client_id in share[i]:
            transfer = services.universal_transfer(
                master=own,
                from_email=emails[source],
                to_email=emails[target],
                asset_code="BTC",
                amount=amount,
                client_tran_id=client_id,
            )
            outcomes[transfer.status] += 1
        return outcomes

    results = run_at_once(threads, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    outcomes = sum(results, Counter())
    assert sum(outcomes.values()) == 1000
    assert outcomes["success"] > 0
    assert sum(free_of(u) for u in family) == total
    for index, user in enumerate(family):
        received = sum(t.amount for t in SubAccountTransfer.objects.filter(to_account=user, status="success"))
        sent = sum(t.amount for t in SubAccountTransfer.objects.filter(from_account=user, status="success"))
        start = Decimal(100) if index == 0 else Decimal(20)
        assert free_of(user) == start + received - sent
    assert SubAccountTransfer.objects.count() == 1000
    assert_ledger_balanced()
