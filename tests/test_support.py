"""tests/support itself: the factories build through the project's services and the ledger, and
the assertions fail when they should."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.models import Asset, Posting, SystemRole, User
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.client import SignedClient
from tests.support.factories import (
    ApiKeyFactory,
    AssetFactory,
    NetworkFactory,
    UserFactory,
    WhitelistAddressFactory,
    customer,
    demo_networks,
    deposit,
    fund,
)

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
