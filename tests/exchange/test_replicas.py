"""Reads of history on a replica (exchange/runtime/replicas.py, docs/scaling.md), against a real
streaming replica of the test PostgreSQL (tests/support/replica.py).

Each test pauses the standby's replay (`pg_wal_replay_pause()`) so that what a read answers says
which database answered it: the standby's copy lacks the last write, the primary has it."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections, transaction
from django.utils import timezone
from psycopg import sql

from convert import selectors as convert_selectors
from exchange.runtime import redis_clients, replicas
from subaccounts import selectors as subaccount_selectors
from tests.support.factories import (
    DepositFactory,
    OrderFactory,
    SubAccountTransferFactory,
    TransferFactory,
    UserFactory,
    WithdrawalFactory,
    convert_markets,
    customer,
    sub_account,
)
from tests.support.replica import remove_replica, start_replica
from tests.support.waiting import wait_until
from wallet import selectors as wallet_selectors

pytestmark = [
    # One standby per module and worker: the module's tests stay on one worker.
    pytest.mark.xdist_group("replica"),
    pytest.mark.django_db(transaction=True, databases=["default", replicas.REPLICA]),
]

V3 = "/openapi/transfer/v3/transfers"


@pytest.fixture(scope="module")
def standby(django_db_setup, django_db_blocker):
    """A hot standby of the test database, as the alias `replica` for this module's tests only (the
    rest of the run has no replica: every read on the primary, as without DATABASE_REPLICA_URL)."""
    primary = connections["default"].settings_dict
    server = start_replica(
        host=primary["HOST"] or "127.0.0.1",
        port=int(primary["PORT"] or 5432),
        user=primary["USER"],
        password=primary["PASSWORD"],
        dbname=primary["NAME"],
    )
    alias = {
        **primary,
        "HOST": server.host,
        "PORT": str(server.port),
        "OPTIONS": {"connect_timeout": 2},
        "TEST": {**primary.get("TEST", {}), "MIRROR": "default"},
    }
    connections.settings[replicas.REPLICA] = alias
    try:
        yield server
    finally:
        connections[replicas.REPLICA].close()
        del connections.settings[replicas.REPLICA]
        if hasattr(connections._connections, replicas.REPLICA):
            delattr(connections._connections, replicas.REPLICA)
        replicas.forget()
        remove_replica(server)


@pytest.fixture
def replica(standby, settings):
    """The standby, replaying, with no account marked as having written; the lag guard looks at
    every read (REPLICA_CHECK_SECONDS 0) and allows any lag unless the test lowers it."""
    settings.REPLICA_CHECK_SECONDS = 0.0
    settings.REPLICA_MAX_LAG_SECONDS = 3600.0
    settings.REPLICA_STICKY_SECONDS = 30.0
    settings.REPLICA_DOWN_SECONDS = 5.0
    replicas.forget()
    resume(standby)
    forget_writes()
    yield standby
    if standby.process.poll() is not None:
        standby.start()
    resume(standby)
    connections[replicas.REPLICA].close()
    replicas.forget()


def pause(standby) -> None:
    """Replay stops once everything written so far is replayed."""
    caught_up(standby)
    with standby.connect_as_superuser() as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        wait_until(lambda: conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0] == "paused")


def resume(standby) -> None:
    with standby.connect_as_superuser() as conn:
        conn.execute("SELECT pg_wal_replay_resume()")


def caught_up(standby) -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        target = cursor.fetchone()[0]
    with standby.connect() as conn:
        wait_until(lambda: conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]).fetchone()[0])


def forget_writes() -> None:
    """No account has written lately, as far as the sticky rule knows."""
    client = redis_clients.client()
    keys = list(client.scan_iter(match=f"{replicas.STICKY_PREFIX}*"))
    if keys:
        client.delete(*keys)


def listed_ids(client) -> list[int]:
    response = client.get(V3)
    assert response.status_code == 200, response.content
    return [int(row["id"]) for row in response.json()["transfers"]]


def two_transfers(standby):
    """Alice's first transfer is on both databases; her second, made with replay paused, only on
    the primary."""
    alice = customer(funding={"USDT": "10"})
    bob = UserFactory()
    first = TransferFactory(sender=alice.user, recipient=bob, amount=Decimal(1), funded=False)
    pause(standby)
    second = TransferFactory(sender=alice.user, recipient=bob, amount=Decimal(2), funded=False, client_transfer_id="c2")
    return alice, first, second


def test_a_history_list_is_read_from_the_replica(replica):
    alice, first, second = two_transfers(replica)
    forget_writes()  # alice has not written lately

    assert listed_ids(alice.client) == [first.pk]  # the standby's copy: its replay is paused
    # A look-up by client id reads the primary (a client resolving an unknown outcome).
    found = alice.client.get(V3, {"client_transfer_id": "c2"})
    assert [int(row["id"]) for row in found.json()["transfers"]] == [second.pk]
    resume(replica)
    caught_up(replica)
    assert listed_ids(alice.client) == [first.pk, second.pk]


def test_the_journal_history_is_read_from_the_replica(replica):
    alice, _, _ = two_transfers(replica)
    forget_writes()
    response = alice.client.get("/openapi/v1/asset/transaction/history", {"tokenId": "USDT"})
    assert response.status_code == 200, response.content
    # funding, the first transfer; not the second (paused replay)
    assert len(response.json()["transactions"]) == 2, response.json()


def test_an_account_that_just_wrote_reads_its_history_on_the_primary(replica):
    alice, first, second = two_transfers(replica)  # the second transfer marked alice (and bob)
    assert listed_ids(alice.client) == [first.pk, second.pk]
    # Without the mark the same read is the standby's (the test above): the mark made the difference.
    forget_writes()
    assert listed_ids(alice.client) == [first.pk]


def test_a_lagging_replica_is_not_read(replica, settings):
    settings.REPLICA_MAX_LAG_SECONDS = 1.0
    alice, first, second = two_transfers(replica)
    forget_writes()
    time.sleep(1.5)  # the standby has received the second transfer and not replayed it for 1.5 s
    assert listed_ids(alice.client) == [first.pk, second.pk]
    assert replicas._health.lag > 1.0
    settings.REPLICA_MAX_LAG_SECONDS = 3600.0  # the same read with the guard's bound out of the way
    assert listed_ids(alice.client) == [first.pk]


def test_a_standby_cut_off_from_its_primary_is_not_read_once_its_copy_is_too_old(replica, settings):
    """A standby whose WAL receiver lost the primary has replayed all it received, and received
    nothing since: it must not pass for current (it would until wal_receiver_timeout, 60 s)."""
    settings.REPLICA_MAX_LAG_SECONDS = 1.0
    with replica.connect_as_superuser() as conn:
        conninfo = conn.execute("SHOW primary_conninfo").fetchone()[0]
        try:
            caught_up(replica)
            conn.execute("ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 connect_timeout=1'")
            conn.execute("SELECT pg_reload_conf()")
            wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()[0] == 0)
            alice = customer(funding={"USDT": "10"})
            bob = UserFactory()
            first = TransferFactory(sender=alice.user, recipient=bob, amount=Decimal(1), funded=False)
            forget_writes()

            def replayed_all_it_received() -> bool:  # the old guard's "current"
                received, replayed = conn.execute(
                    "SELECT pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text"
                ).fetchone()
                return received == replayed

            # The startup process may still be replaying the last record received (seen under load:
            # received 3/4A25E000, replayed 3/4A25DFB0): wait for it, as the guard would see it later.
            wait_until(replayed_all_it_received, what="the standby replaying all it received")
            time.sleep(1.5)  # the standby's newest commit is now older than the bound
            assert listed_ids(alice.client) == [first.pk]  # from the primary: the standby lacks alice
            assert replicas._health.lag > 1.0
        finally:
            conn.execute(sql.SQL("ALTER SYSTEM SET primary_conninfo = {}").format(sql.Literal(conninfo)))
            conn.execute("SELECT pg_reload_conf()")
    wait_until(lambda: _streaming(replica))
    caught_up(replica)


def _streaming(standby) -> bool:
    with standby.connect_as_superuser() as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'").fetchone()[0] == 1


def test_a_replica_that_is_down_leaves_reads_to_the_primary(replica, settings):
    settings.REPLICA_CHECK_SECONDS = 3600.0  # the guard's last look (usable) stands while it goes down
    alice, first, second = two_transfers(replica)
    forget_writes()
    assert listed_ids(alice.client) == [first.pk]  # the standby answered; the guard remembers it usable
    replica.stop()
    # The read on the replica fails: it runs again on the primary, and the replica is skipped.
    assert listed_ids(alice.client) == [first.pk, second.pk]
    assert not replicas._health.usable
    replicas.forget()  # the guard looks again: the replica does not answer
    assert listed_ids(alice.client) == [first.pk, second.pk]
    assert replicas.history_alias([alice.user.pk]) == replicas.PRIMARY


def test_a_read_inside_a_transaction_is_the_primarys(replica):
    alice, _, _ = two_transfers(replica)
    forget_writes()
    assert replicas.history_alias([alice.user.pk]) == replicas.REPLICA
    with transaction.atomic():
        assert replicas.history_alias([alice.user.pk]) == replicas.PRIMARY


def _window() -> dict:
    now = timezone.now()
    return {"start": now - timedelta(days=1), "end": now + timedelta(minutes=1)}


def _deposits(user):
    def read():
        return wallet_selectors.deposit_list(
            user=user, coin=None, tx_id=None, statuses=None, offset=0, limit=100, **_window()
        )

    return lambda: DepositFactory(account=user), read


def _withdrawals(user):
    def read():
        return wallet_selectors.withdrawal_list(
            user=user, coin=None, withdraw_order_id=None, status=None, offset=0, limit=100, **_window()
        )

    return lambda: WithdrawalFactory(account=user), read


def _conversions(user):
    convert_markets()

    def read():
        return convert_selectors.order_history(user_id=user.pk, size=100).orders

    return lambda: OrderFactory(user=user), read


def _family_transfers(master, **page) -> list:
    return subaccount_selectors.universal_transfer_history(
        master=master, from_account=None, to_account=None, client_tran_id=None, asset_code=None, **page, **_window()
    ).transfers


def _universal_transfers(user):
    sub = sub_account(user)
    made = lambda: SubAccountTransferFactory(master=user, target=sub)  # noqa: E731
    return made, lambda: _family_transfers(user, page=1, limit=100)


def _sub_transfers(user):
    sub = sub_account(user)

    def read():
        return subaccount_selectors.sub_transfer_history(
            sub=sub,
            direction=subaccount_selectors.TRANSFERS_IN,
            asset_code=None,
            client_tran_id=None,
            page=1,
            limit=100,
            **_window(),
        ).transfers

    return lambda: SubAccountTransferFactory(master=user, target=sub), read


@pytest.mark.parametrize("history", [_deposits, _withdrawals, _conversions, _universal_transfers, _sub_transfers])
def test_every_history_of_the_design_is_read_from_the_replica(replica, history, settings):
    """docs/scaling.md's list: deposits, withdrawals, conversions, the sub-accounts' transfers (the
    transfers and the journal: the tests above)."""
    settings.CONVERT_QUOTE_INTERVAL_MS = 0
    made, read = history(UserFactory())
    made()
    pause(replica)
    made()
    forget_writes()
    assert len(read()) == 1  # the standby's copy
    resume(replica)
    caught_up(replica)
    assert len(read()) == 2


def test_a_transfer_between_two_sub_accounts_keeps_their_masters_history_on_the_primary(replica):
    """The posting moves the two sub-accounts, not the master, yet the master's history lists it:
    the sticky rule asks about the whole family."""
    master = UserFactory()
    one, two = sub_account(master), sub_account(master)
    SubAccountTransferFactory(master=master, source=one, target=two)
    pause(replica)
    SubAccountTransferFactory(master=master, source=one, target=two)  # marks one and two
    assert len(_family_transfers(master, page=1, limit=100)) == 2
    forget_writes()
    assert len(_family_transfers(master, page=1, limit=100)) == 1  # without the marks: the standby's
