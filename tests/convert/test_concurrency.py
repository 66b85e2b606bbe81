"""Accepts under real concurrency on PostgreSQL: real threads, each with its own database connection
(closed at the thread's end), committing for real (transaction=True).

- 200 accepts of one quote through the HTTP API from 40 threads (PostgreSQL's max_connections is
  shared with other test runs here; the first wave of 40 starts on one barrier): exactly one
  SUCCESS, every other answer "quote was already accepted", money moved once; the same when the
  customer holds exactly the source amount (the losers then see an insufficient balance first);
- 32 customers, two per liquidity shard, accepting at once: all succeed, each shard pays exactly
  its customers, nothing waits long on a lock;
- conversions larger than any one shard, at once: paid by several shards together, no deadlock
  (one posting locks its shards in the ledger's order), the house never below zero.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from decimal import Decimal

import pytest
from django.db import connections

from accounts.ledger.models import BusinessType, Posting
from accounts.models import User
from convert import errors, services
from convert.models import Order, OrderStatus
from tests.convert.helpers import ACCEPT, FAILED, USED, drain, free, refill, shard_of, shards
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.client import SignedClient, now_ms
from tests.support.factories import customer

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE_SECONDS = 150


def _run(count: int, work) -> list:
    """`work(i)` in `count` threads started together; their results (or the exception's text)."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - reported by the assertions
            results[i] = f"{type(exc).__name__}: {exc}"
        finally:
            connections.close_all()

    pool = [threading.Thread(target=run, args=(i,), name=f"convert-{i}") for i in range(count)]
    for thread in pool:
        thread.start()
    deadline = time.monotonic() + DEADLINE_SECONDS
    for thread in pool:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread.name for thread in pool if thread.is_alive()]
    assert not stuck, f"threads still running after {DEADLINE_SECONDS}s (deadlock?): {stuck}"
    return results


@pytest.mark.parametrize("funding", ["1", "0.01"], ids=["plenty", "exactly-the-source"])
def test_200_accepts_of_one_quote_move_money_once(convert_world, settings, funding):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    settings.QUOTE_TTL_SECONDS = 600
    alice = customer(funding={"BTC": funding})
    quote = services.quote_create(user=alice.user, source_code="BTC", target_code="PHP", source_amount=Decimal("0.01"))
    threads, per_thread = 40, 5
    stamp = now_ms()

    def accept_five(i: int) -> list:
        client = SignedClient(alice.api_key.key, alice.secret)  # its own django.test.Client
        bodies = []
        for k in range(per_thread):
            response = client.post(
                ACCEPT,
                {"quoteId": quote.quote_id, "recvWindow": 60000},
                timestamp=stamp - i * per_thread - k,  # each request signed anew (no replay)
            )
            bodies.append((response.status_code, response.json()))
        return bodies

    results = _run(threads, accept_five)
    answers = [answer for result in results for answer in (result if isinstance(result, list) else [result])]
    assert len(answers) == threads * per_thread == 200, answers[:3]
    successes = [body for status, body in answers if body.get("status") == 0]
    order = Order.objects.get()
    assert successes == [{"status": 0, "error": "OK", "data": {"orderId": str(order.pk), "status": "SUCCESS"}}]
    others = Counter(
        (status, body.get("status"), body.get("error")) for status, body in answers if body != successes[0]
    )
    assert others == {(200, FAILED, USED): 199}, others
    assert order.status == OrderStatus.SUCCESS
    assert Posting.objects.filter(kind=BusinessType.CONVERT).count() == 1
    assert_balance(alice.user, "BTC", Decimal(funding) - Decimal("0.01"))
    assert_balance(alice.user, "PHP", quote.target_amount)
    assert_ledger_balanced()


def test_customers_in_the_same_and_different_shards_convert_at_once(convert_world, settings):
    settings.QUOTE_TTL_SECONDS = 600
    people = [customer(funding={"BTC": "1"}) for _ in range(32)]
    by_shard = defaultdict(list)
    for person in people:
        by_shard[shard_of(person.user)].append(person)
    assert len(by_shard) == 16
    assert all(len(group) == 2 for group in by_shard.values())  # two customers on every shard
    quotes = [
        services.quote_create(user=p.user, source_code="BTC", target_code="PHP", source_amount=Decimal("0.1"))
        for p in people
    ]
    before = {s: (free(s, "BTC"), free(s, "PHP")) for s in shards()}
    took: list[float] = [0.0] * len(people)

    def accept(i: int) -> str:
        user = User.objects.get(pk=people[i].user.pk)  # this thread's instance, on its connection
        began = time.perf_counter()
        order = services.quote_accept(user=user, quote_id=quotes[i].quote_id)
        took[i] = time.perf_counter() - began
        return order.status

    results = _run(len(people), accept)
    assert results == ["SUCCESS"] * len(people), results
    for shard, group in by_shard.items():
        paid = sum(q.target_amount for q, p in zip(quotes, people, strict=True) if p in group)
        assert free(shard, "BTC") == before[shard][0] + Decimal("0.2")
        assert free(shard, "PHP") == before[shard][1] - paid
    for person, q in zip(people, quotes, strict=True):
        assert_balance(person.user, "BTC", "0.9")
        assert_balance(person.user, "PHP", q.target_amount)
    assert Posting.objects.filter(kind=BusinessType.CONVERT).count() == len(people)
    assert max(took) < 30, f"slowest accept took {max(took):.1f}s"
    assert_ledger_balanced()


def test_conversions_larger_than_any_shard_at_once(convert_world, settings):
    """Every shard holds 4 BTC (64 in all); 16 customers each buy about 4.8 BTC at once: no single
    shard can pay any of them, so each posting takes from several shards. At most 13 can be paid;
    the rest are refused for liquidity (a plan whose shards a concurrent accept emptied first is
    tried once: "try again later"). No deadlock, no shard below zero, the books balance."""
    settings.QUOTE_TTL_SECONDS = 600
    drain(*shards(), code="BTC")
    for shard in shards():
        refill(shard, "BTC", "4")
    people = [customer(funding={"PHP": "26000000"}) for _ in range(16)]
    quotes = [
        services.quote_create(user=p.user, source_code="PHP", target_code="BTC", source_amount=Decimal("25000000"))
        for p in people
    ]
    assert all(q.target_amount > 4 for q in quotes)

    def accept(i: int) -> str:
        user = User.objects.get(pk=people[i].user.pk)
        try:
            return services.quote_accept(user=user, quote_id=quotes[i].quote_id).status
        except errors.ConvertError as exc:
            return exc.msg

    results = _run(len(people), accept)
    outcomes = Counter(results)
    assert set(outcomes) <= {"SUCCESS", "failed to fetch liquidity, try again later"}, outcomes
    assert 1 <= outcomes["SUCCESS"] <= 13, outcomes
    paid = sum(q.target_amount for q, r in zip(quotes, results, strict=True) if r == "SUCCESS")
    house = sum(free(s, "BTC") for s in shards())
    assert house == 64 - paid
    assert all(free(s, "BTC") >= 0 for s in shards())
    assert Order.objects.filter(status=OrderStatus.SUCCESS).count() == outcomes["SUCCESS"]
    assert Posting.objects.filter(kind=BusinessType.CONVERT).count() == outcomes["SUCCESS"]
    assert_ledger_balanced()
