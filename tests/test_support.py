"""tests/support itself: the factories build through the project's services and the ledger, and
the assertions fail when they should."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.models import Asset, Posting, SystemRole, User
from convert.models import OrderStatus
from subaccounts.models import CollectionStatus
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.client import SignedClient
from tests.support.factories import (
    ApiKeyFactory,
    AssetFactory,
    DepositFactory,
    FundCollectionFactory,
    NetworkFactory,
    OrderFactory,
    QuoteFactory,
    SubAccountTransferFactory,
    TransferFactory,
    UserFactory,
    WhitelistAddressFactory,
    WithdrawalFactory,
    convert_markets,
    customer,
    demo_networks,
    deposit,
    fund,
    sub_account,
)
from wallet.models import DepositStatus, WithdrawalStage

pytestmark = pytest.mark.django_db


def test_users_and_keys_are_made_by_the_services():
    user = UserFactory(is_staff=True)
    assert User.objects.get(pk=user.pk).is_staff
    assert user.check_password("pw-for-tests")
    assert user.ledger is not None  # the ledger account every customer gets
    api_key, secret = ApiKeyFactory(user=user)
    assert api_key.user == user
    assert SignedClient.of((api_key, secret)).get("/openapi/v1/account").status_code == 200


def test_assets_and_networks_are_the_demo_worlds_and_got_again():
    php = AssetFactory(code="PHP")
    assert (php.name, php.transfer_precision, php.is_fiat, php.reference_price) == (
        "Philippine peso",
        2,
        True,
        Decimal(1),
    )
    assert AssetFactory(code="PHP") == php
    assert Asset.objects.filter(code="PHP").count() == 1
    trx = NetworkFactory(coin__code="USDT", network="TRX")
    assert (trx.withdraw_fee, trx.withdraw_min, trx.min_confirm) == (Decimal(1), Decimal(10), 3)
    assert len(demo_networks()) == 4
    assert NetworkFactory(coin=AssetFactory(code="USDT"), network="TRX") == trx
    entry = WhitelistAddressFactory(network=trx)
    assert entry.address == "TDemoMasterWhitezistAddress1111111"


def test_fund_posts_through_the_ledger_from_the_equity_account():
    user = UserFactory()
    fund(user, "USDT", "12.5")
    fund(user, AssetFactory(code="USDT"), Decimal("0.5"))
    assert_balance(user, "USDT", "13")
    assert_balance(user, "BTC", 0)
    equity = User.objects.get(system_role=SystemRole.EQUITY)
    assert_balance(equity, "USDT", "-13")
    assert Posting.objects.filter(kind="DISTRIBUTION").count() == 2
    deposit(user, "0.25", asset="USDT")
    assert_balance(user, "USDT", "13.25")
    assert_ledger_balanced()
    with pytest.raises(TypeError):
        fund(user, "USDT", 0.1)
    with pytest.raises(AssertionError):
        assert_balance(user, "USDT", "13.25", locked="1")


def test_a_customer_has_a_key_a_client_and_its_balances():
    alice = customer(funding={"PHP": "100"}, email="alice@test.example")
    assert alice.user.email == "alice@test.example"
    assert alice.api_key.user == alice.user
    assert_balance(alice.user, "PHP", "100")
    response = alice.client.get("/openapi/v1/account")
    assert response.status_code == 200, response.content
    unsigned = alice.client.get("/openapi/v1/account", signed=False)
    assert_error(unsigned, -1105, 400, msg_contains="timestamp")
    with pytest.raises(AssertionError):
        assert_error(unsigned, -1105, 400, msg_contains="not in the message")


def test_the_example_of_tests_readme():
    alice = customer(funding={"PHP": "100"})
    bob = UserFactory()
    response = alice.client.post(
        "/openapi/transfer/v4/transfers", {"account": "PHP", "target_address": bob.email, "amount": "101"}
    )
    assert_error(response, -1131, 400)
    assert_balance(alice.user, "PHP", "100")
    assert_ledger_balanced()


# --- money movements: made by the services, the ledger balanced after each --------------------------


def test_deposits_are_credited_by_the_wallet_once_successful():
    user = UserFactory()
    credited = DepositFactory(account=user, amount="12.5", confirmations=7, age=timedelta(days=2))
    assert (credited.status, credited.confirmations, credited.credited_at is not None) == (
        DepositStatus.SUCCESS,
        7,
        True,
    )
    assert credited.inserted_at < timezone.now() - timedelta(days=1)
    assert Posting.objects.filter(kind="CHAIN_DEPOSIT", reference=f"deposit:{credited.pk}").count() == 1
    for status in (DepositStatus.PROCESSING, DepositStatus.FAILED, DepositStatus.NEED_FILL_DATA):
        assert DepositFactory(account=user, status=status, coin="BTC", network="BTC").status == status
    assert_balance(user, "USDT", "12.5")
    assert_balance(user, "BTC", 0)
    assert_ledger_balanced()


def test_withdrawals_are_applied_and_settled_by_the_wallet():
    user = UserFactory()
    done = WithdrawalFactory(account=user, withdraw_order_id="wo-1", tx_id="ab" * 32, confirmations=4)
    assert (done.stage, done.tx_id, done.confirmations, done.fee) == (WithdrawalStage.SUCCEEDED, "ab" * 32, 4, 1)
    queued = WithdrawalFactory(account=user, stage=WithdrawalStage.QUEUED, age=timedelta(days=8))
    assert queued.applied_at < timezone.now() - timedelta(days=7)
    failed = WithdrawalFactory(account=user, stage=WithdrawalStage.FAILED)
    assert failed.info == "rejected by operations"
    for stage in (WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.BROADCASTING):
        assert WithdrawalFactory(account=user, stage=stage).stage == stage
    eth = WithdrawalFactory(account=user, coin="ETH", network="ETH", amount="0.1")
    assert eth.network.coin.code == "ETH"
    assert_balance(user, "USDT", "11", locked="33")  # failed: released; 3 holds of 11; the rest sent
    assert_balance(user, "ETH", 0)
    assert_ledger_balanced()


def test_transfers_quotes_and_orders_are_made_by_their_services(settings):
    settings.CONVERT_QUOTE_INTERVAL_MS = 0
    alice, bob = UserFactory(), UserFactory()
    transfer = TransferFactory(sender=alice, recipient=bob, amount="2.5", client_transfer_id="t-1")
    assert (transfer.sender_id, transfer.recipient_id, transfer.client_transfer_id) == (alice.pk, bob.pk, "t-1")
    assert_balance(alice, "USDT", 0)
    assert_balance(bob, "USDT", "2.5")
    convert_markets()
    quote = QuoteFactory(user=alice, source="PHP", target="USDT", source_amount="100")
    assert quote.pair.source.code == "PHP"
    order = OrderFactory(user=alice, source="BTC", target="PHP", source_amount="0.01")
    assert order.status == OrderStatus.SUCCESS
    assert_balance(alice, "BTC", 0)
    assert OrderFactory(user=alice, source="BTC", outcome="insufficient").status == OrderStatus.FAILED
    assert OrderFactory(user=alice, outcome="expire").status == OrderStatus.FAILED
    assert_ledger_balanced()


def test_sub_account_transfers_and_collections_are_made_by_their_services():
    master = UserFactory()
    sub = sub_account(master)
    assert (sub.master_id, sub.is_virtual) == (master.pk, True)
    SubAccountTransferFactory(master=master, target=sub, amount=Decimal(3))
    SubAccountTransferFactory(master=master, source=sub, target=master, amount=Decimal(1), funded=False)
    assert_balance(sub, "USDT", "2")
    collected = FundCollectionFactory(master=master, run=True)
    assert collected.status == CollectionStatus.SUCCESS
    assert_balance(sub, "USDT", 0)
    assert_balance(master, "USDT", "3")
    assert FundCollectionFactory(master=master).status == CollectionStatus.INIT
    assert_ledger_balanced()
