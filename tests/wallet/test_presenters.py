"""Selectors return data, APIs render it (issue 13, item 4): a selector gives model instances and
dataclasses with Python values (Decimal, datetime), reusable by the admin, a task or another app; a
presenter turns them into the spec's JSON (field names, amounts as exact decimal strings with the
asset's transfer precision, times in ms or ISO 8601 UTC as the spec has them)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts import presenters as account_presenters
from accounts import selectors as account_selectors
from accounts.keyring import KeyRecord
from exchange.platform import presenters as exchange_presenters
from exchange.platform import selectors as exchange_selectors
from tests.support.factories import AssetFactory, NetworkFactory, customer
from wallet import presenters, selectors
from wallet.models import Deposit, DepositStatus, Transfer, Withdrawal, WithdrawalStage
from wallet.transfers import presenters as transfer_presenters
from wallet.transfers import selectors as transfer_selectors
from wallet.transfers import services as transfer_services

pytestmark = pytest.mark.django_db

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _window() -> dict:
    now = timezone.now()
    return {"start": now - timedelta(days=1), "end": now + timedelta(days=1), "offset": 0, "limit": 1000}


def test_deposit_history_selector_returns_decimals_and_presenter_the_spec_strings():
    alice = customer()
    usdt_trx = NetworkFactory(coin__code="USDT", network="TRX")  # transfer precision 6
    exact = Deposit.objects.create(
        account=alice.user,
        network=usdt_trx,
        address="TAddrExact",
        tag="memo-1",
        amount=Decimal("0.123456789"),
        tx_id="a" * 64,
        status=DepositStatus.SUCCESS,
        confirmations=3,
    )
    Deposit.objects.create(
        account=alice.user, network=usdt_trx, address="TAddrRound", amount=Decimal(5), tx_id="b" * 64, confirmations=0
    )

    deposits = selectors.deposit_list(user=alice.user, coin=None, tx_id=None, statuses=None, **_window())

    assert [d.pk for d in deposits] == sorted(d.pk for d in deposits)  # oldest first
    first = deposits[0]
    assert isinstance(first, Deposit)
    assert isinstance(first.amount, Decimal)
    assert first.amount == Decimal("0.123456789")
    assert isinstance(first.inserted_at, datetime)
    assert presenters.deposit_json(first) == {
        "id": str(exact.pk),
        "address": "TAddrExact",
        "addressTag": "memo-1",
        "amount": "0.123456789",  # exact: more decimals than the precision are kept, never rounded
        "coin": "USDT",
        "confirmNo": 3,
        "insertTime": _ms(exact.inserted_at),
        "network": "TRX",
        "status": DepositStatus.SUCCESS,
        "txId": "a" * 64,
    }
    assert list(presenters.deposit_json(first)) == [  # the spec's field order
        "id",
        "address",
        "addressTag",
        "amount",
        "coin",
        "confirmNo",
        "insertTime",
        "network",
        "status",
        "txId",
    ]
    rounded = presenters.deposit_json(deposits[1])
    assert rounded["amount"] == "5.000000"  # padded to the coin's transfer precision
    assert isinstance(rounded["insertTime"], int)


def test_deposit_history_selector_serves_another_owner():
    """The same selector reads any account's deposits (e.g. a sub-account's, for its master)."""
    alice, bob = customer(), customer()
    btc = NetworkFactory(coin__code="BTC", network="BTC")
    Deposit.objects.create(account=bob.user, network=btc, address="bc1bob", amount=Decimal("0.5"), tx_id="c" * 64)

    assert selectors.deposit_list(user=alice.user, coin=None, tx_id=None, statuses=None, **_window()) == []
    (only,) = selectors.deposit_list(user=bob.user, coin="BTC", tx_id=None, statuses=None, **_window())
    assert only.amount == Decimal("0.5")
    assert presenters.deposit_json(only)["amount"] == "0.50000000"


def test_withdrawal_and_coin_selectors_return_decimals():
    alice = customer(funding={"USDT": "12.5"})
    usdt_trx = NetworkFactory(coin__code="USDT", network="TRX")
    Withdrawal.objects.create(
        account=alice.user,
        network=usdt_trx,
        address="TAddr",
        amount=Decimal("10.1234567"),
        fee=Decimal(1),
        stage=WithdrawalStage.SUCCEEDED,
    )

    (withdrawal,) = selectors.withdrawal_list(
        user=alice.user, coin=None, withdraw_order_id=None, status=None, **_window()
    )
    assert (withdrawal.amount, withdrawal.fee) == (Decimal("10.1234567"), Decimal(1))
    rendered = presenters.withdrawal_json(withdrawal)
    assert (rendered["amount"], rendered["transactionFee"]) == ("10.1234567", "1.000000")
    assert rendered["applyTime"] == _ms(withdrawal.applied_at)
    assert rendered["withdrawOrderId"] == ""

    coins = {coin.asset.code: coin for coin in selectors.coin_list(user=alice.user)}
    usdt = coins["USDT"]
    assert (usdt.free, usdt.locked) == (Decimal("12.5"), Decimal(0))
    assert all(isinstance(v, Decimal) for coin in coins.values() for v in (coin.free, coin.locked))
    coin_json = presenters.coin_json(usdt)
    assert (coin_json["free"], coin_json["locked"]) == ("12.500000", "0.000000")
    assert coin_json["networkList"][0]["withdrawFee"] == "1.000000"


def test_transfer_selectors_return_models_and_presenters_the_spec_strings():
    alice = customer(funding={"PHP": "1000"})
    bob = customer()
    AssetFactory(code="PHP")  # transfer precision 2

    created = transfer_services.transfer_create(
        sender=alice.user,
        asset_code="PHP",
        target_address=bob.user.email,
        amount=Decimal("150.5"),
        message="lunch",
        client_transfer_id="c-1",
    )
    # Built from the row the posting wrote (Model.from_db), not read again: a saved instance.
    assert isinstance(created, Transfer)
    assert not created._state.adding
    assert created._state.db == "default"
    stored = Transfer.objects.get(pk=created.pk)
    assert [getattr(created, f.attname) for f in Transfer._meta.concrete_fields] == [
        getattr(stored, f.attname) for f in Transfer._meta.concrete_fields
    ]
    assert transfer_presenters.created_json(created) == {
        "id": str(created.pk),
        "status": "success",
        "account": "PHP",
        "target_address": bob.user.email,
        "amount": "150.50",
        "fee_amount": "0.00",
        "exchange": None,
        "payment": str(created.posting_id),
        "client_transfer_id": "c-1",
        "message": "lunch",
        "errorMessage": None,
    }

    transfer = transfer_selectors.transfer_get(user=bob.user, transfer_id=str(created.pk))
    assert isinstance(transfer.amount, Decimal)
    assert transfer.amount == Decimal("150.5")
    assert isinstance(transfer.created_at, datetime)
    assert transfer.created_at.utcoffset() == timedelta(0)
    as_recipient = transfer_presenters.transfer_json(transfer, viewer=bob.user)
    as_sender = transfer_presenters.transfer_json(transfer, viewer=alice.user)
    assert (as_recipient["type"], as_sender["type"]) == (1, 2)
    assert as_recipient["amount"] == "150.50"
    assert as_recipient["sourceAddress"] == as_recipient["source_address"] == alice.user.email
    assert ISO_MS.fullmatch(as_recipient["created_at"]), as_recipient["created_at"]
    assert datetime.fromisoformat(as_recipient["created_at"]) == transfer.created_at.replace(
        microsecond=transfer.created_at.microsecond // 1000 * 1000
    )

    page = transfer_selectors.transfer_list(user=alice.user, page=1, per_page=10)
    assert (page.total_count, page.next_page, page.previous_page) == (1, None, None)
    assert page.transfers[0].amount == Decimal("150.5")
    listed = transfer_presenters.transfer_list_json(page, viewer=alice.user)
    assert listed == {
        "transfers": [as_sender],
        "meta": {"total_count": 1, "next_page": None, "previous_page": None},
    }
    assert transfer_presenters.transfer_list_json(transfer_selectors.NO_TRANSFERS, viewer=alice.user) == {
        "transfers": [],
        "meta": {"total_count": 0, "next_page": None, "previous_page": None},
    }


def test_iso_time_is_utc_with_milliseconds():
    moment = datetime(2026, 11, 22, 8, 0, 0, 123456, tzinfo=UTC)
    assert transfer_presenters._iso_millis(moment) == "2026-11-22T08:00:00.123Z"


def test_account_selectors_return_decimals_and_presenters_the_spec_strings():
    alice = customer(funding={"BTC": "1.5", "PHP": "10"})

    info = account_selectors.account_info(user=alice.user)
    balances = {row.asset.code: row for row in info.balances}
    assert balances["BTC"].free == Decimal("1.5")
    assert isinstance(balances["BTC"].locked, Decimal)
    assert isinstance(info.updated_at, datetime)
    rendered = account_presenters.account_info_json(info)
    assert {"asset": "BTC", "free": "1.50000000", "locked": "0.00000000"} in rendered["balances"]
    assert {"asset": "PHP", "free": "10.00", "locked": "0.00"} in rendered["balances"]
    assert rendered["updateTime"] == _ms(info.updated_at)
    assert list(rendered)[:6] == ["canTrade", "canDeposit", "canWithdraw", "accountType", "updateTime", "balances"]

    (btc,) = account_selectors.crypto_accounts(user=alice.user, currency="BTC")
    assert btc.free == Decimal("1.5")
    assert account_presenters.crypto_accounts_json([btc], account_id=alice.user.pk) == {
        "crypto-accounts": [
            {
                "id": f"{alice.user.pk}-BTC",
                "name": btc.asset.name,
                "currency": "BTC",
                "balance": "1.50000000",
                "pending_balance": "0.00000000",
            }
        ]
    }

    now = timezone.now()
    history = account_selectors.transaction_history(
        user=alice.user, asset=btc.asset, start=now - timedelta(days=1), end=now, page=1, size=20
    )
    (row,) = history.rows
    assert row.changed == Decimal("1.5")
    assert isinstance(row.changed, Decimal)
    assert isinstance(row.created_at, datetime)
    assert account_presenters.transaction_history_json(history) == {
        "transactions": [
            {
                "txId": str(row.posting_id),
                "bizSubject": "DISTRIBUTION",
                "status": "SUCCESS",
                "changed": "1.50000000",
                "tokenId": "BTC",
                "time": str(_ms(row.created_at)),  # a string of ms here, as the spec has it
            }
        ],
        "meta": {"has_next": False},
    }

    (key,) = account_selectors.api_key_list(user=alice.user)
    assert isinstance(key, KeyRecord)
    assert account_presenters.api_key_json(key)["createTime"] == str(key.created_at_ms)


def test_business_status_selector_returns_booleans():
    rows = exchange_selectors.business_status_list()
    assert all(isinstance(row.is_on, bool) for row in rows)
    assert [exchange_presenters.business_status_json(row) for row in rows] == [
        {"businessType": row.business_type, "businessStatus": "on"} for row in rows
    ]
