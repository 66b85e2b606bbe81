"""The optimistic posting (`ledger.post(known=...)`, PostgreSQL): one statement that locks the
accounts' ledger rows and writes only if each is still exactly as the caller read it; otherwise
nothing is written and the posting goes the locked way. These tests run outside any transaction
(that is the only place the optimistic write is used) and count the locked way's lock statements
to show which way a posting went."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from accounts import ledger
from accounts.ledger import posting
from accounts.ledger.check import ledger_check
from accounts.models import Asset, BalanceChange, Entry, LedgerAccount, LimitCounter, Posting
from exchange.api.errors import InsufficientBalance
from tests.ledger.test_concurrency import (
    _wait_for_lock_waiters,
    assert_change_feed_consistent,
    balance,
    fund,
    is_deadlock,
    run_threads,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the optimistic write is PostgreSQL's")


@pytest.fixture
def btc(db):
    return Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8)


@pytest.fixture
def locked_ways(monkeypatch):
    """How many postings took the locked way (its lock statement), from any thread."""
    calls = []
    original = posting._lock_accounts

    def counting(account_ids):
        calls.append(tuple(account_ids))
        return original(account_ids)

    monkeypatch.setattr(posting, "_lock_accounts", counting)
    return calls


def known(*account_ids) -> dict[int, ledger.LedgerState]:
    rows = LedgerAccount.objects.filter(user_id__in=account_ids).values_list(
        "user_id", "seq", "allow_negative", "track_limits"
    )
    return {user_id: ledger.LedgerState(seq, negative, track) for user_id, seq, negative, track in rows}


def move(source, target, amount, reference, **extra):
    return ledger.post(
        legs=ledger.move(source, target, "BTC", Decimal(amount)), kind="P2P_TRANSFER", reference=reference, **extra
    )


@pytest.fixture
def pair(make_user, btc):
    alice, bob = make_user(), make_user()
    fund(alice.id, "BTC", Decimal(10), "fund:alice")
    fund(bob.id, "BTC", Decimal(10), "fund:bob")
    return alice.id, bob.id


def test_nothing_moved_since_one_statement_writes_the_posting(pair, locked_ways):
    alice, bob = pair
    heard = []
    ledger.after_commit_listeners.append(heard.append)
    try:
        result = move(alice, bob, "1.5", "p2p:1", known=known(alice, bob))
    finally:
        ledger.after_commit_listeners.remove(heard.append)
    assert locked_ways == []
    assert heard == [result]  # the listeners ran once, after the commit
    assert balance(alice, "BTC") == (Decimal("8.5"), Decimal(0))
    assert balance(bob, "BTC") == (Decimal("11.5"), Decimal(0))
    assert {(b.account_id, b.seq, b.free) for b in result.balances} == {
        (alice, 2, Decimal("8.5")),
        (bob, 2, Decimal("11.5")),
    }
    assert_change_feed_consistent([alice, bob])
    assert known(alice, bob) == {alice: ledger.LedgerState(2, False, True), bob: ledger.LedgerState(2, False, True)}
    assert ledger_check().ok


def test_a_moved_account_makes_it_go_the_locked_way(pair, locked_ways):
    alice, bob = pair
    before = known(alice, bob)
    fund(bob, "BTC", Decimal(1), "fund:bob:again")  # bob's seq moves
    locked_ways.clear()
    result = move(alice, bob, "2", "p2p:1", known=before)
    assert locked_ways == [(alice, bob)]
    assert {(b.account_id, b.seq, b.free) for b in result.balances} == {(alice, 2, Decimal(8)), (bob, 3, Decimal(13))}
    assert_change_feed_consistent([alice, bob])
    assert ledger_check().ok


def test_a_changed_flag_makes_it_go_the_locked_way(pair, locked_ways):
    alice, bob = pair
    before = known(alice, bob)
    LedgerAccount.objects.filter(user_id=alice).update(track_limits=False)  # the seq does not move
    move(alice, bob, "2", "p2p:1", known=before)
    assert locked_ways == [(alice, bob)]
    # Decided on the flag as it is now: alice's outflow is no longer counted, bob's inflow is.
    assert set(LimitCounter.objects.filter(p2p_out__gt=0).values_list("account_id", flat=True)) == set()
    assert set(LimitCounter.objects.filter(p2p_in__gt=0).values_list("account_id", flat=True)) == {bob}


def test_an_insufficient_balance_is_refused_by_the_one_statement(pair, locked_ways):
    alice, bob = pair
    postings = Posting.objects.count()
    with pytest.raises(InsufficientBalance):
        move(alice, bob, "10.00000001", "p2p:1", known=known(alice, bob))
    assert locked_ways == []
    assert Posting.objects.count() == postings
    assert balance(alice, "BTC") == (Decimal(10), Decimal(0))
    assert known(alice, bob)[alice].seq == 1
    assert ledger_check().ok


def test_a_repeated_reference_is_refused_and_moves_nothing(pair, locked_ways):
    alice, bob = pair
    move(alice, bob, "1", "p2p:same", known=known(alice, bob))
    entries = Entry.objects.count()
    with pytest.raises(IntegrityError):
        move(alice, bob, "1", "p2p:same", known=known(alice, bob))
    assert locked_ways == []
    assert Entry.objects.count() == entries
    assert balance(alice, "BTC") == (Decimal(9), Decimal(0))


def test_a_guard_is_skipped_only_for_a_state_it_passed_on(pair, locked_ways):
    alice, bob = pair
    guarded = []
    state = known(alice, bob)
    move(alice, bob, "1", "p2p:1", known=state, guard=lambda: guarded.append(1))  # no unchanged_since
    assert (guarded, len(locked_ways)) == ([1], 1)
    state = known(alice, bob)
    move(alice, bob, "1", "p2p:2", known=state, guard=lambda: guarded.append(2), unchanged_since=(alice, 0))
    assert (guarded, len(locked_ways)) == ([1, 2], 2)  # passed on another state: checked under the lock
    state = known(alice, bob)
    seq = state[alice].seq
    move(alice, bob, "1", "p2p:3", known=state, guard=lambda: guarded.append(3), unchanged_since=(alice, seq))
    assert (guarded, len(locked_ways)) == ([1, 2], 2)  # one statement, the guard's check still holds


def test_a_guard_passed_on_an_account_outside_the_posting_is_run_under_the_lock(pair, make_user, locked_ways):
    """unchanged_since must name an account the statement locks and compares: carol is known but
    not in the posting, and her seq moved after the caller's check (review finding, session 4)."""
    alice, bob = pair
    carol = make_user().id
    fund(carol, "BTC", Decimal(1), "fund:carol")
    state = known(alice, bob, carol)
    fund(carol, "BTC", Decimal(1), "fund:carol:again")
    locked_ways.clear()
    guarded = []
    move(
        alice,
        bob,
        "1",
        "p2p:1",
        known=state,
        guard=lambda: guarded.append(1),
        unchanged_since=(carol, state[carol].seq),
    )
    assert guarded == [1]
    assert locked_ways == [(alice, bob)]


def test_balances_refuse_writes_that_bypass_the_ledger(pair):
    """The optimistic posting trusts that only postings write balances (each advances the seq)."""
    from accounts.models import Balance

    alice, _ = pair
    row = Balance.objects.get(account_id=alice)
    for write in (
        lambda: Balance.objects.filter(account_id=alice).update(free=Decimal(99)),
        lambda: Balance.objects.filter(account_id=alice).delete(),
        lambda: Balance.objects.create(account_id=alice, asset=row.asset, free=1, updated_at=row.updated_at),
        lambda: row.save(),
        lambda: row.delete(),
    ):
        with pytest.raises(TypeError, match=r"only through accounts\.ledger\.post"):
            write()
    assert balance(alice, "BTC") == (Decimal(10), Decimal(0))


def test_a_transfer_through_the_service_is_one_statement_when_nothing_moved(pair, locked_ways):
    from accounts.models import User
    from wallet.transfers import services

    alice, bob = pair
    Asset.objects.filter(code="BTC").update(transfer_min_quantity=Decimal("0.1"))
    services.assets.clear()
    transfer = services.transfer_create(
        sender=User.objects.get(pk=alice),
        asset_code="BTC",
        target_address=User.objects.get(pk=bob).email,
        amount=Decimal("0.5"),
    )
    assert locked_ways == []
    assert transfer.posting_id is not None
    assert balance(bob, "BTC") == (Decimal("10.5"), Decimal(0))
    assert_change_feed_consistent([alice, bob])


def test_a_posting_of_two_assets_advances_each_seq_by_two(pair, locked_ways):
    alice, bob = pair
    Asset.objects.create(code="ETH", name="Ether", transfer_precision=8)
    fund(alice, "ETH", Decimal(3), "fund:alice:eth")
    locked_ways.clear()
    state = known(alice, bob)
    result = ledger.post(
        legs=[*ledger.move(alice, bob, "BTC", Decimal(1)), *ledger.move(alice, bob, "ETH", Decimal(2))],
        kind="P2P_TRANSFER",
        reference="p2p:two-assets",
        known=state,
    )
    assert locked_ways == []
    assert sorted((b.account_id, b.asset, b.seq) for b in result.balances) == sorted(
        [(alice, "BTC", 3), (alice, "ETH", 4), (bob, "BTC", 2), (bob, "ETH", 3)]
    )
    assert known(alice, bob)[alice].seq == 4
    assert balance(bob, "ETH") == (Decimal(2), Decimal(0))
    assert_change_feed_consistent([alice, bob])
    assert ledger_check().ok


def test_with_autocommit_off_outside_atomic_it_goes_the_locked_way(pair, locked_ways):
    """The one statement commits on its own only in autocommit: otherwise the listeners would hear
    of a posting before it is committed."""
    alice, bob = pair
    heard = []
    ledger.after_commit_listeners.append(heard.append)
    connection.set_autocommit(False)
    try:
        move(alice, bob, "1", "p2p:manual", known=known(alice, bob))
        assert locked_ways == [(alice, bob)]
        assert heard == []  # not committed yet
        connection.commit()
    finally:
        connection.set_autocommit(True)  # Django runs the on-commit hooks of manual transactions here
        ledger.after_commit_listeners.remove(heard.append)
    assert len(heard) == 1
    assert balance(bob, "BTC") == (Decimal(11), Decimal(0))


def test_inside_a_transaction_or_with_an_unknown_account_it_goes_the_locked_way(pair, make_user, locked_ways):
    alice, bob = pair
    with transaction.atomic():
        move(alice, bob, "1", "p2p:1", known=known(alice, bob))
    carol = make_user().id
    move(alice, carol, "1", "p2p:2", known=known(alice))
    assert locked_ways == [(alice, bob), (alice, carol)]
    assert balance(carol, "BTC") == (Decimal(1), Decimal(0))


def test_a_posting_that_moved_the_account_while_the_statement_waited_for_the_lock(pair, locked_ways):
    """The statement's snapshot is older than the row it locks: it must see the newer row (READ
    COMMITTED re-reads a locked row), find the seq moved and leave the posting to the locked way.
    Were it to trust its snapshot, bob's balance would lose the other posting's 5 BTC."""
    alice, bob = pair
    state = known(alice, bob)
    holding, release = threading.Event(), threading.Event()
    errors = []

    def other_posting():
        try:
            with transaction.atomic():
                move(alice, bob, "5", "p2p:other")  # locks both rows, commits when released
                holding.set()
                release.wait(10)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            holding.set()
        finally:
            connection.close()

    results = []

    def optimistic():
        try:
            results.append(move(alice, bob, "1", "p2p:mine", known=state))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=other_posting)
    first.start()
    assert holding.wait(10)
    second = threading.Thread(target=optimistic)
    second.start()
    _wait_for_lock_waiters(1)
    release.set()
    first.join(10)
    second.join(10)
    assert errors == []
    assert [ways for ways in locked_ways] == [(alice, bob), (alice, bob)]  # the other's, then mine
    assert {(b.account_id, b.seq, b.free) for b in results[0].balances} == {
        (alice, 3, Decimal(4)),
        (bob, 3, Decimal(16)),
    }
    assert balance(bob, "BTC") == (Decimal(16), Decimal(0))
    assert_change_feed_consistent([alice, bob])
    assert ledger_check().ok


def test_optimistic_postings_both_ways_from_16_threads(pair, locked_ways):
    """Opposite directions on the same two accounts at once: no deadlock, nothing lost, and both
    ways were taken (the first posting of a burst finds its state; most others find it moved)."""
    alice, bob = pair
    rounds = 30

    def work(index: int) -> None:
        for i in range(rounds):
            source, target = (alice, bob) if (index + i) % 2 else (bob, alice)
            move(source, target, "0.01", f"p2p:{index}:{i}", known=known(alice, bob))

    escaped = run_threads(16, work)
    assert not [exc for exc in escaped if is_deadlock(exc)]
    assert escaped == []
    assert Posting.objects.filter(reference__startswith="p2p:").count() == 16 * rounds
    assert 0 < len(locked_ways) < 16 * rounds
    assert balance(alice, "BTC")[0] + balance(bob, "BTC")[0] == Decimal(20)
    assert_change_feed_consistent([alice, bob])
    check = ledger_check()
    assert check.ok, check.report()


def test_the_same_reference_from_20_threads_moves_money_once(pair):
    alice, bob = pair
    state = known(alice, bob)
    outcomes = []

    def work(index: int) -> None:
        try:
            move(alice, bob, "3", "p2p:twin", known=state)
            outcomes.append("ok")
        except IntegrityError:
            outcomes.append("duplicate")

    assert run_threads(20, work) == []
    assert sorted(outcomes) == ["duplicate"] * 19 + ["ok"]
    assert balance(alice, "BTC") == (Decimal(7), Decimal(0))
    assert BalanceChange.objects.filter(posting__reference="p2p:twin").count() == 2
    assert ledger_check().ok
