"""The ledger's hot statements on PostgreSQL: really prepared (Django turns psycopg's prepared
statements off unless the settings ask for them), and covered by Django's connection health check
like any other query."""

from decimal import Decimal

import psycopg
import pytest
from django.db import connection

from accounts import ledger
from accounts.ledger.posting import fetch_prepared
from accounts.models import Asset, SystemRole

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL prepared statements")


def test_a_posting_prepares_its_statements_once_per_connection(make_user):
    Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8)
    alice = make_user().id
    world = ledger.system_account_id(SystemRole.WORLD)
    for n in range(3):
        ledger.post(legs=ledger.move(world, alice, "BTC", Decimal(1)), kind="CHAIN_DEPOSIT", reference=f"dep:{n}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("FOR UPDATE" in sql and "accounts_ledgeraccount" in sql for sql in prepared), prepared
    assert any("INSERT INTO accounts_posting" in sql for sql in prepared), prepared


@pytest.mark.django_db(transaction=True)
def test_health_check_replaces_a_dead_connection_before_a_prepared_statement(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    connection.ensure_connection()
    connection.health_check_enabled = True  # read from the settings when it connected
    backend = connection.connection.info.backend_pid
    with psycopg.connect(_dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    connection.health_check_done = False  # a new request begins (Django resets it on request_started)
    assert fetch_prepared("SELECT %s::int + 1", [41]) == [(42,)]
    assert connection.connection.info.backend_pid != backend


def _dsn() -> str:
    db = connection.settings_dict
    return f"host={db['HOST']} port={db['PORT']} user={db['USER']} password={db['PASSWORD']} dbname={db['NAME']}"


def test_array_literals_carry_exact_decimals_and_refuse_foreign_text(make_user):
    from accounts.ledger.posting import array_literal

    Asset.objects.create(code="BTC", name="Bitcoin", transfer_precision=8)
    alice, bob = make_user().id, make_user().id
    world = ledger.system_account_id(SystemRole.WORLD)
    tiny, huge = Decimal("1E-18"), Decimal("123456789012345678.123456789012345678")
    ledger.post(legs=ledger.move(world, alice, "BTC", huge), kind="CHAIN_DEPOSIT", reference="dep:huge")
    result = ledger.post(legs=ledger.move(alice, bob, "BTC", tiny), kind="P2P_TRANSFER", reference="p2p:tiny")
    after = {b.account_id: b.free for b in result.balances}
    assert after == {alice: huge - tiny, bob: tiny}
    assert array_literal([1, Decimal("-0.5"), True, "F"]) == "{1,-0.5,t,F}"
    for foreign in ("a,b", "}", "FL", '"'):
        with pytest.raises(TypeError):
            array_literal([foreign])


def test_the_zero_sum_rule_is_the_statement_trigger_only(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'accounts_entry'::regclass AND NOT tgisinternal"
            " ORDER BY tgname"
        )
        assert [row[0] for row in cursor.fetchall()] == ["entry_append_only", "entry_statement_sums_to_zero"]
