from decimal import Decimal

import pytest
from django.core.management import call_command

from accounts.ledger.check import ledger_check
from accounts.models import Balance, User
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from wallet.chain.simulator import advance_blocks
from wallet.deposits import deposits_scan
from wallet.models import Deposit, DepositStatus, Withdrawal, WithdrawalStage


def _free(email, code):
    return Balance.objects.get(account__email=email, asset__code=code).free


@pytest.mark.django_db
def test_config_and_address(master_client):
    coins = master_client.get("/openapi/wallet/v1/config/getall").json()
    usdt = next(c for c in coins if c["coin"] == "USDT")
    assert [n["network"] for n in usdt["networkList"]] == ["ETH", "TRX"]
    assert usdt["free"] == "100000.000000"
    first = master_client.get("/openapi/wallet/v1/deposit/address", {"coin": "USDT", "network": "TRX"}).json()
    again = master_client.get("/openapi/wallet/v1/deposit/address", {"coin": "USDT", "network": "TRX"}).json()
    assert first == again
    assert first["address"].startswith("T")


@pytest.mark.django_db
def test_deposit_life(master_client, settings):
    settings.TRAVEL_RULE_THRESHOLD = Decimal(0)
    call_command("deposit", "master@demo.exchange", "BTC", "0.25", "--network", "BTC")
    deposit = Deposit.objects.get()
    assert deposit.status == DepositStatus.PROCESSING
    before = _free("master@demo.exchange", "BTC")
    advance_blocks(5, network="BTC")
    deposits_scan()
    deposits_scan()
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert _free("master@demo.exchange", "BTC") == before + Decimal("0.25")
    history = master_client.get("/openapi/wallet/v1/deposit/history").json()
    assert history[0]["status"] == 1
    assert ledger_check().ok


@pytest.mark.django_db
def test_withdrawal_life(master_client, django_capture_on_commit_callbacks):
    before = _free("master@demo.exchange", "ETH")
    with django_capture_on_commit_callbacks(execute=True):
        response = master_client.post(
            "/openapi/wallet/v1/withdraw/apply",
            {
                "coin": "ETH",
                "network": "ETH",
                "address": "0x00000000000000000000000000000000000d3e40",
                "amount": "1.5",
                "withdrawOrderId": "w1",
            },
        )
    assert response.status_code == 200, response.content
    withdrawal = Withdrawal.objects.get(pk=int(response.json()["id"]))
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED  # eager task in tests
    assert _free("master@demo.exchange", "ETH") == before - Decimal("1.505")
    master = User.objects.get(email="master@demo.exchange")
    assert Balance.objects.get(account=master, asset__code="ETH").locked == 0
    history = master_client.get("/openapi/wallet/v1/withdraw/history", {"withdrawOrderId": "w1"}).json()
    assert history[0]["status"] == 1
    assert history[0]["transactionFee"] == "0.00500000"
    assert ledger_check().ok


@pytest.mark.django_db
def test_demo_read_only_key(demo):
    ro = SignedClient(demo["readonly"]["api_key"], demo["readonly"]["secret_key"])
    response = ro.post(
        "/openapi/wallet/v1/withdraw/apply",
        {"coin": "USDT", "network": "TRX", "address": "TDemoMasterWhitezistAddress1111111", "amount": "10"},
    )
    assert_error(response, -1020, 401)
    assert not Withdrawal.objects.exists()
    assert ledger_check().ok
