"""H1, the race the review found: the policy checks an account as the process last cached it, so a
freeze committed elsewhere (its cache eviction not yet arrived, or lost) must still stop money
leaving. The ledger row carries `may_send`, kept by the database from the account
(accounts/migrations/0012), and every posting that sends at an owner's request reads it under the
row's lock (ledger.post(senders=...))."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import psycopg
import pytest
from django.db import connection

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.errors import AccountMayNotSend
from accounts.ledger.models import LedgerAccount
from accounts.models import Balance, SystemRole, User
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import demo_accounts
from wallet.models import Transfer
from wallet.transfers import services as transfer_services

V4 = "/openapi/transfer/v4/transfers"
MASTER = "master@demo.exchange"
PEER = "peer@demo.exchange"


def may_send(email: str) -> bool:
    return LedgerAccount.objects.get(user__email=email).may_send


@pytest.fixture
def parties(db) -> dict[str, dict]:
    """The demo's master and peer with their keys and funding (the factories' demo_accounts)."""
    return demo_accounts()


def test_the_database_keeps_may_send_from_the_account(parties, make_user):
    assert may_send(PEER)
    for flags, expected in (
        ({"is_frozen": True}, False),
        ({"is_frozen": False}, True),
        ({"can_withdraw": False}, False),
        ({"can_withdraw": True, "is_active": False}, False),
        ({"is_active": True}, True),
    ):
        User.objects.filter(email=PEER).update(**flags)  # a raw UPDATE: no signal, no service
        assert may_send(PEER) is expected, flags
    world = LedgerAccount.objects.filter(user__system_role=SystemRole.WORLD)  # every shard
    assert world.count() == len(ledger.role_account_ids(SystemRole.WORLD)) > 1
    assert not world.filter(may_send=True).exists()
    frozen_at_birth = make_user(is_frozen=True)
    assert LedgerAccount.objects.get(user=frozen_at_birth).may_send is False
    assert LedgerAccount.objects.get(user=make_user()).may_send is True


def test_a_freeze_the_process_has_not_heard_of_still_stops_the_transfer(parties, settings):
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    client = SignedClient(parties["peer"]["api_key"], parties["peer"]["secret_key"])
    params = {"account": "PHP", "target_address": MASTER, "amount": "10"}
    assert client.post(V4, params).status_code == 200  # the keyring now caches the peer, unfrozen
    User.objects.filter(email=PEER).update(is_frozen=True)  # committed elsewhere; no eviction here
    before = Balance.objects.get(account__email=PEER, asset__code="PHP").free
    assert_error(client.post(V4, params), -1152, 401)
    assert Balance.objects.get(account__email=PEER, asset__code="PHP").free == before
    assert Transfer.objects.count() == 1
    assert ledger_check().ok


@pytest.mark.django_db(transaction=True)
def test_a_transfer_waits_for_a_freeze_in_progress_and_is_refused(transactional_db, settings):
    """Real transactions: the freeze holds the peer's ledger row (its trigger updates it) while a
    transfer of the peer waits for that lock; the freeze commits; the transfer is refused."""
    demo_accounts()
    peer = User.objects.get(email=PEER)
    dsn = connection.get_connection_params()
    dsn.pop("cursor_factory", None)
    dsn.pop("context", None)
    outcome: dict[str, object] = {}

    def transfer() -> None:
        try:
            transfer_services.transfer_create(
                sender=User.objects.get(pk=peer.pk), asset_code="PHP", target_address=MASTER, amount=Decimal(5)
            )
            outcome["result"] = "sent"
        except AccountMayNotSend:
            outcome["result"] = "refused"
        finally:
            connection.close()

    with psycopg.connect(**dsn) as freezer:
        freezer.execute("UPDATE accounts_user SET is_frozen = TRUE WHERE id = %s", [peer.pk])  # not committed yet
        worker = threading.Thread(target=transfer)
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive(), "the transfer must wait for the freeze's lock on the ledger row"
        freezer.commit()
    worker.join(timeout=30)
    assert outcome == {"result": "refused"}
    assert Transfer.objects.count() == 0
    assert ledger_check().ok
