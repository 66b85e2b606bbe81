"""What PostgreSQL itself refuses, whatever code writes to it (accounts/ledger/models.py and
migration 0003): negative balances, non-positive entries, unbalanced postings (at commit),
changes to the append-only journal and change feed. And what the ledger check reports when a
balance was tampered with anyway."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

import psycopg.errors
import pytest
from django.core.management import call_command
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.models import Asset, Balance, BalanceChange, Entry, Posting, SystemRole

pytestmark = pytest.mark.django_db


@pytest.fixture
def btc(db):
    return Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8)


@pytest.fixture
def eth(db):
    return Asset.objects.create(code="ETH", name="Ether", transfer_precision=8)


@pytest.fixture
def funded(make_user, btc):
    """alice holds 5 BTC free and 1 locked, all of it from the outside world."""
    alice = make_user().id
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, alice, "BTC", Decimal(6)), kind="CHAIN_DEPOSIT", reference="dep:1")
    ledger.post(legs=ledger.hold(alice, "BTC", Decimal(1)), kind="CHAIN_WITHDRAWAL", reference="wd:1")
    return alice, world, btc


def sql(statement: str, params: list | tuple = ()) -> int:
    """One raw statement in its own savepoint; the row count."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


def refused(error_class: type[BaseException], statement: str, params: list | tuple = ()):
    """The statement fails with `error_class` (the psycopg error behind Django's)."""
    with pytest.raises(DatabaseError) as caught:
        sql(statement, params)
    assert isinstance(caught.value.__cause__, error_class), repr(caught.value.__cause__)
    return caught.value


# --- balances ------------------------------------------------------------------------------------------


def test_a_customer_balance_cannot_be_set_negative(funded):
    alice, _, btc = funded
    error = refused(
        psycopg.errors.CheckViolation,
        "UPDATE accounts_balance SET free = -0.000000000000000001 WHERE account_id = %s AND asset_id = %s",
        [alice, btc.id],
    )
    assert isinstance(error, IntegrityError)
    assert "balance_not_negative" in str(error)
    refused(
        psycopg.errors.CheckViolation,
        "UPDATE accounts_balance SET locked = -1 WHERE account_id = %s AND asset_id = %s",
        [alice, btc.id],
    )
    assert Balance.objects.get(account_id=alice, asset=btc).free == Decimal(5)


def test_a_negative_customer_balance_cannot_be_inserted(make_user, btc):
    bob = make_user().id
    refused(
        psycopg.errors.CheckViolation,
        "INSERT INTO accounts_balance (account_id, asset_id, free, locked, allow_negative, updated_at)"
        " VALUES (%s, %s, -1, 0, false, now())",
        [bob, btc.id],
    )


def test_the_outside_world_may_go_negative_in_free_but_never_in_locked(funded):
    _, world, btc = funded
    assert Balance.objects.get(account_id=world, asset=btc).free == Decimal(-6)  # allowed: it mirrors deposits
    assert sql("UPDATE accounts_balance SET free = -7 WHERE account_id = %s", [world]) == 1  # still allowed
    refused(
        psycopg.errors.CheckViolation,
        "UPDATE accounts_balance SET locked = -1 WHERE account_id = %s AND asset_id = %s",
        [world, btc.id],
    )


# --- entries -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("amount", ["0", "-1", "-0.000000000000000001"])
def test_an_entry_amount_must_be_positive(funded, amount):
    alice, _, btc = funded
    posting_id = Posting.objects.get(reference="dep:1").id
    error = refused(
        psycopg.errors.CheckViolation,
        "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount)"
        " VALUES (%s, %s, %s, 'F', 1, %s)",
        [posting_id, alice, btc.id, Decimal(amount)],
    )
    assert "entry_amount_positive" in str(error)


def test_an_entry_side_is_plus_or_minus_one(funded):
    alice, _, btc = funded
    posting_id = Posting.objects.get(reference="dep:1").id
    refused(
        psycopg.errors.CheckViolation,
        "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount)"
        " VALUES (%s, %s, %s, 'F', 2, 1)",
        [posting_id, alice, btc.id],
    )


# --- postings sum to zero per asset (each INSERT of entries, migration 0010) ---------------------------


def raw_posting(reference: str, entries: list[tuple[int, int, int, str]], *, one_statement: bool = True) -> int:
    """A posting and its entries (account, asset, side, amount) written by hand, in one atomic
    block (a real COMMIT in a transaction=True test, a savepoint otherwise); the entries in one
    INSERT, or one INSERT each."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_posting (kind, reference, memo, created_at)"
            " VALUES ('OTHERS', %s, '', now()) RETURNING id",
            [reference],
        )
        posting_id = cursor.fetchone()[0]
        rows = [[posting_id, account, asset, side, Decimal(amount)] for account, asset, side, amount in entries]
        for batch in [rows] if one_statement else [[row] for row in rows]:
            sql = "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount) VALUES "
            values = ", ".join(["(%s, %s, %s, 'F', %s, %s)"] * len(batch))
            cursor.execute(sql + values, [v for row in batch for v in row])
    return posting_id


@pytest.mark.django_db(transaction=True)
def test_an_unbalanced_posting_is_refused_and_nothing_of_it_stays(make_user, btc):
    alice, bob = make_user().id, make_user().id
    with pytest.raises(IntegrityError) as caught:
        raw_posting("raw:unbalanced", [(alice, btc.id, 1, "1")])
    assert isinstance(caught.value.__cause__, psycopg.errors.CheckViolation)
    assert "does not sum to zero" in str(caught.value)
    assert not Posting.objects.filter(reference="raw:unbalanced").exists()
    assert not Entry.objects.exists()

    raw_posting("raw:balanced", [(alice, btc.id, 1, "1"), (bob, btc.id, -1, "1")])  # committed
    assert Entry.objects.filter(posting__reference="raw:balanced").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_posting_must_balance_per_asset_not_only_in_total(make_user, btc, eth):
    alice, bob = make_user().id, make_user().id
    with pytest.raises(IntegrityError, match="does not sum to zero"):
        raw_posting("raw:cross", [(alice, btc.id, 1, "1"), (bob, eth.id, -1, "1")])
    assert not Posting.objects.filter(reference="raw:cross").exists()


def test_each_posting_of_a_statement_must_balance_on_its_own(funded, make_user):
    alice, _, btc = funded
    bob = make_user().id
    first = raw_posting("raw:first", [(alice, btc.id, -1, "1"), (bob, btc.id, 1, "1")])
    second = raw_posting("raw:second", [(alice, btc.id, -1, "2"), (bob, btc.id, 1, "2")])
    # One statement whose rows sum to zero in total, but +1 / -1 per posting: refused.
    with pytest.raises(IntegrityError, match="does not sum to zero"), transaction.atomic():
        connection.cursor().execute(
            "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount) VALUES"
            " (%s, %s, %s, 'F', 1, 1), (%s, %s, %s, 'F', -1, 1)",
            [first, alice, btc.id, second, alice, btc.id],
        )


def test_a_posting_written_one_entry_per_statement_is_refused_at_its_first_entry(funded, make_user):
    """The rule is checked per statement (no deferred check at commit): a posting's entries are
    written by one statement, as ledger.post does."""
    alice, _, btc = funded
    bob = make_user().id
    with pytest.raises(IntegrityError, match="does not sum to zero"):
        raw_posting("raw:split", [(alice, btc.id, -1, "2.5"), (bob, btc.id, 1, "2.5")], one_statement=False)
    assert not Posting.objects.filter(reference="raw:split").exists()


def test_a_balanced_addition_to_an_old_posting_keeps_it_balanced(funded, make_user):
    alice, _, btc = funded
    bob = make_user().id
    posting_id = raw_posting("raw:old", [(alice, btc.id, -1, "1"), (bob, btc.id, 1, "1")])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_entry (posting_id, account_id, asset_id, bucket, side, amount) VALUES"
            " (%s, %s, %s, 'F', 1, 3), (%s, %s, %s, 'F', -1, 3)",
            [posting_id, alice, btc.id, posting_id, bob, btc.id],
        )
        cursor.execute(
            "SELECT SUM(side * amount) FROM accounts_entry WHERE posting_id = %s GROUP BY asset_id", [posting_id]
        )
        assert cursor.fetchall() == [(Decimal(0),)]


# --- the journal is append-only ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE accounts_entry SET amount = amount + 1",
        "UPDATE accounts_entry SET account_id = account_id",  # even a no-op update
        "DELETE FROM accounts_entry",
        "UPDATE accounts_posting SET memo = 'edited'",
        "UPDATE accounts_posting SET reference = reference || ':x'",
        "DELETE FROM accounts_posting",
    ],
)
def test_the_journal_cannot_be_updated_or_deleted(funded, statement):
    before = list(Entry.objects.order_by("id").values_list("id", "amount", "account_id"))
    postings_before = list(Posting.objects.order_by("id").values_list("id", "reference", "memo"))
    error = refused(psycopg.errors.InsufficientPrivilege, statement)
    assert "append-only" in str(error)
    assert list(Entry.objects.order_by("id").values_list("id", "amount", "account_id")) == before
    assert list(Posting.objects.order_by("id").values_list("id", "reference", "memo")) == postings_before


# --- the change feed: only its publication may be recorded ----------------------------------------------


@pytest.mark.parametrize(
    "assignment",
    [
        "delta_free = delta_free + 1",
        "delta_locked = 0",
        "free_after = free_after + 1",
        "locked_after = 7",
        "seq = seq + 100",
        "kind = 'OTHERS'",
        "created_at = now() - interval '1 day'",
    ],
)
def test_change_feed_amounts_cannot_be_changed(funded, assignment):
    alice, _, _ = funded
    error = refused(
        psycopg.errors.InsufficientPrivilege,
        f"UPDATE accounts_balancechange SET {assignment} WHERE account_id = %s",  # noqa: S608 - a fixed list
        [alice],
    )
    assert "change feed" in str(error)


def test_change_feed_rows_cannot_be_deleted(funded):
    refused(psycopg.errors.InsufficientPrivilege, "DELETE FROM accounts_balancechange")
    assert BalanceChange.objects.count() == 3  # deposit: alice and world; hold: alice


def test_change_feed_rows_can_be_marked_published(funded):
    alice, _, _ = funded
    assert sql("UPDATE accounts_balancechange SET published_at = now() WHERE account_id = %s", [alice]) == 2
    rows = BalanceChange.objects.filter(account_id=alice)
    assert all(row.published_at is not None for row in rows)
    assert [(row.seq, row.free_after, row.locked_after) for row in rows.order_by("seq")] == [
        (1, Decimal(6), Decimal(0)),
        (2, Decimal(5), Decimal(1)),
    ]
    # and through the ORM, as the relay does
    assert BalanceChange.objects.filter(account_id=alice).update(published_at=timezone.now()) == 2


# --- tampering shows in the ledger check ----------------------------------------------------------------


def test_a_tampered_balance_is_reported_by_the_ledger_check_and_the_command_exits_1(funded):
    alice, _, btc = funded
    assert ledger_check().ok
    out = StringIO()
    call_command("ledger_check", stdout=out, stderr=StringIO())
    assert "OK" in out.getvalue()

    sql("UPDATE accounts_balance SET free = free + 1 WHERE account_id = %s AND asset_id = %s", [alice, btc.id])

    result = ledger_check()
    assert not result.ok
    report = result.report()
    assert "1 problem(s)" in report
    assert f"account {alice} BTC" in report
    assert "balance free=6" in report
    assert "journal free=5" in report

    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("ledger_check", stdout=out, stderr=err)
    assert exited.value.code == 1
    assert f"account {alice} BTC" in err.getvalue()
    assert "journal free=5" in err.getvalue()


def test_a_tampered_locked_amount_and_a_missing_balance_row_are_reported(funded):
    alice, world, btc = funded
    sql("UPDATE accounts_balance SET locked = 0 WHERE account_id = %s AND asset_id = %s", [alice, btc.id])
    sql("DELETE FROM accounts_balance WHERE account_id = %s", [world])
    report = ledger_check().report()
    assert "2 problem(s)" in report
    assert "locked=0" in report
    assert f"account {world} asset {btc.id}: journal" in report


# --- the posting function accepts what the columns hold, exactly ---------------------------------------


@pytest.mark.parametrize("amount", ["10000000000", "123456789012345678.123456789012345678"])
def test_an_amount_the_column_holds_can_be_posted(make_user, btc, amount):
    """NUMERIC(36, 18) holds 18 integer digits. Python's default decimal context has 28 digits, so
    quantize() to 18 places raises InvalidOperation from 10**10 units up (e.g. 10 billion of a
    low-priced token) and -amount in the shapes rounds an amount of more than 28 digits."""
    alice = make_user().id
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, alice, "BTC", Decimal(amount)), kind="CHAIN_DEPOSIT", reference="dep:big")
    assert Balance.objects.get(account_id=alice, asset=btc).free == Decimal(amount)
    check = ledger_check()
    assert check.ok, check.report()


def test_a_balance_of_more_than_28_digits_is_not_rounded(make_user, btc):
    """Two amounts accepted today whose sum needs 29 digits: free + delta in the default decimal
    context rounds the stored balance, which then differs from its journal (ledger check drift)."""
    alice = make_user().id
    world = ledger.system_account_id(SystemRole.WORLD)
    big = Decimal("9999999999.999999999999999999")  # 28 digits
    ledger.post(legs=ledger.move(world, alice, "BTC", big), kind="CHAIN_DEPOSIT", reference="dep:big")
    tiny = Decimal("0.000000000000000002")
    ledger.post(legs=ledger.move(world, alice, "BTC", tiny), kind="CHAIN_DEPOSIT", reference="dep:tiny")
    assert Balance.objects.get(account_id=alice, asset=btc).free == Decimal("10000000000.000000000000000001")
    check = ledger_check()
    assert check.ok, check.report()


def test_journal_tables_keep_one_index_leading_with_the_account_and_no_redundant_one():
    """Migration 0011 dropped each journal table's own account_id index: a unique constraint or
    composite index already leads with the account (and serves every look-up by account)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's catalog")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.relname, i.relname, array_agg(a.attname ORDER BY k.n) FROM pg_index x"
            " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid"
            " CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)"
            " JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum"
            " WHERE t.relname IN ('accounts_balance', 'accounts_balancechange', 'accounts_entry',"
            " 'accounts_limitcounter') GROUP BY t.relname, i.relname"
        )
        indexes = cursor.fetchall()
    for table in ("accounts_balance", "accounts_balancechange", "accounts_entry", "accounts_limitcounter"):
        columns = [cols for name, _, cols in indexes if name == table]
        assert ["account_id"] not in columns, table
        assert any(cols[0] == "account_id" and len(cols) > 1 for cols in columns), table


def test_balances_refuse_orm_writes_that_bypass_the_ledger(funded):
    """Only postings write balances (under their accounts' ledger locks, which is what keeps the
    balances a posting reads stable): the model refuses every ORM write."""
    alice, _, btc = funded
    row = Balance.objects.get(account_id=alice)
    for write in (
        lambda: Balance.objects.filter(account_id=alice).update(free=Decimal(99)),
        lambda: Balance.objects.filter(account_id=alice).delete(),
        lambda: Balance.objects.create(account_id=alice, asset=btc, free=1, updated_at=row.updated_at),
        lambda: Balance.objects.get_or_create(account_id=alice, asset=btc),
        lambda: Balance.objects.bulk_create([Balance(account_id=alice, asset=btc, updated_at=row.updated_at)]),
        lambda: row.save(),
        lambda: row.delete(),
    ):
        with pytest.raises(TypeError, match=r"only through accounts\.ledger\.post"):
            write()
    row = Balance.objects.get(account_id=alice)
    assert (row.free, row.locked) == (Decimal(5), Decimal(1))
