"""GET deposit/history, withdraw/history and withdraw/address-whitelist: every rule of the spec
(status vs statuses, the 90-day default and limit, the 7-day withdrawOrderId rule, offset and
limit up to 1000, ascending order) and the records' fields and types."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.ledger.check import ledger_check
from accounts.models import ApiKeyType, User
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import (
    ApiKeyFactory,
    Customer,
    DepositFactory,
    NetworkFactory,
    WhitelistAddressFactory,
    WithdrawalFactory,
    customer,
    demo_networks,
)
from wallet.models import Deposit, DepositStatus, Network, WhitelistAddress, Withdrawal, WithdrawalStage

pytestmark = pytest.mark.django_db

DEPOSITS = "/openapi/wallet/v1/deposit/history"
WITHDRAWALS = "/openapi/wallet/v1/withdraw/history"
WHITELIST = "/openapi/wallet/v1/withdraw/address-whitelist"
DAY_MS = 24 * 3600 * 1000
TRX_ADDRESS = "TDemoMasterWhitezistAddress1111111"


@pytest.fixture(autouse=True)
def _roomy_rate_limits(db, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 10**6
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**6


@pytest.fixture
def owner() -> Customer:
    """The caller: a customer with a withdrawal whitelist entry on every network (as the demo master)."""
    caller = customer()
    for network in demo_networks():
        WhitelistAddressFactory(
            account=caller.user, network=network, name=f"demo {network.coin.code} {network.network}"
        )
    return caller


@pytest.fixture
def demo_master(owner) -> User:
    return owner.user


@pytest.fixture
def master_client(owner) -> SignedClient:
    return owner.client


@pytest.fixture
def peer() -> Customer:
    return customer()


def _ms(moment) -> int:
    return int(moment.timestamp() * 1000)


def _network(coin: str = "USDT", network: str = "TRX") -> Network:
    return NetworkFactory(coin__code=coin, network=network)


def _ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [int(r["id"]) for r in response.json()]


# --- deposit history: records ------------------------------------------------------------------


def test_deposit_record_fields_and_types(master_client, demo_master):
    deposit = DepositFactory(account=demo_master, amount=Decimal("12.5"), tag="", confirmations=7)
    [record] = master_client.get(DEPOSITS).json()
    assert set(record) == {
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
    }
    assert record == {
        "id": str(deposit.pk),
        "address": deposit.address,
        "addressTag": "",
        "amount": "12.500000",
        "coin": "USDT",
        "confirmNo": 7,
        "insertTime": _ms(deposit.inserted_at),
        "network": "TRX",
        "status": 1,
        "txId": deposit.tx_id,
    }
    for name in ("id", "address", "addressTag", "amount", "coin", "network", "txId"):
        assert isinstance(record[name], str), name
    for name in ("confirmNo", "insertTime", "status"):
        assert type(record[name]) is int, name
    assert ledger_check().ok


def test_deposit_history_only_the_callers(master_client, demo_master, peer):
    mine = DepositFactory(account=demo_master)
    DepositFactory(account=peer.user)
    assert _ids(master_client.get(DEPOSITS)) == [mine.pk]


def test_deposit_history_ascending(master_client, demo_master):
    a = DepositFactory(account=demo_master, age=timedelta(days=1))
    b = DepositFactory(account=demo_master, age=timedelta(days=3))
    c = DepositFactory(account=demo_master, age=timedelta(hours=1))
    d = DepositFactory(account=demo_master, age=timedelta(days=2))
    assert _ids(master_client.get(DEPOSITS)) == [b.pk, d.pk, a.pk, c.pk]


def test_deposit_history_filters_coin_and_tx_id(master_client, demo_master):
    usdt = DepositFactory(account=demo_master)
    btc = DepositFactory(account=demo_master, coin="BTC", network="BTC", address="bc1qxyz")
    assert _ids(master_client.get(DEPOSITS, {"coin": "BTC"})) == [btc.pk]
    assert _ids(master_client.get(DEPOSITS, {"coin": "USDT"})) == [usdt.pk]
    assert _ids(master_client.get(DEPOSITS, {"coin": "ETH"})) == []
    assert _ids(master_client.get(DEPOSITS, {"txId": usdt.tx_id})) == [usdt.pk]
    assert _ids(master_client.get(DEPOSITS, {"txId": "nope"})) == []


# --- deposit history: status and statuses ------------------------------------------------------


@pytest.fixture
def every_status(demo_master) -> dict[int, Deposit]:
    return {status: DepositFactory(account=demo_master, status=status) for status in (0, 1, 2, 3)}


def test_deposit_status_filter(master_client, every_status):
    for status, deposit in every_status.items():
        response = master_client.get(DEPOSITS, {"status": status})
        assert _ids(response) == [deposit.pk]
        assert response.json()[0]["status"] == status


def test_deposit_statuses_filter(master_client, every_status):
    assert _ids(master_client.get(DEPOSITS, {"statuses": "0,1"})) == [every_status[0].pk, every_status[1].pk]
    assert _ids(master_client.get(DEPOSITS, {"statuses": "3,2"})) == [every_status[2].pk, every_status[3].pk]
    assert _ids(master_client.get(DEPOSITS, {"statuses": "1"})) == [every_status[1].pk]
    assert len(_ids(master_client.get(DEPOSITS))) == 4


def test_deposit_status_and_statuses_conflict(master_client, every_status):
    assert_error(master_client.get(DEPOSITS, {"status": 1, "statuses": "0,1"}), -1107, 400)


@pytest.mark.parametrize(
    "params",
    [
        {"status": 4},
        {"status": -1},
        {"status": "x"},
        {"statuses": "0,4"},
        {"statuses": "4"},
        {"statuses": "a,b"},
        {"statuses": "1;2"},
    ],
)
def test_deposit_invalid_status(master_client, every_status, params):
    assert_error(master_client.get(DEPOSITS, params), -1025, 400)


# --- deposit history: periods ------------------------------------------------------------------


def test_deposit_default_90_days(master_client, demo_master):
    old = DepositFactory(account=demo_master, age=timedelta(days=91))
    recent = DepositFactory(account=demo_master, age=timedelta(days=89))
    assert _ids(master_client.get(DEPOSITS)) == [recent.pk]
    now = timezone.now()
    window = {"startTime": _ms(now - timedelta(days=100)), "endTime": _ms(now - timedelta(days=11))}
    assert _ids(master_client.get(DEPOSITS, window)) == [old.pk, recent.pk]
    window = {"startTime": _ms(now - timedelta(days=100)), "endTime": _ms(now - timedelta(days=90))}
    assert _ids(master_client.get(DEPOSITS, window)) == [old.pk]


def test_deposit_start_time_only(master_client, demo_master):
    DepositFactory(account=demo_master, age=timedelta(days=5))
    recent = DepositFactory(account=demo_master, age=timedelta(days=1))
    start = _ms(timezone.now() - timedelta(days=2))
    assert _ids(master_client.get(DEPOSITS, {"startTime": start})) == [recent.pk]


def test_deposit_end_time_only(master_client, demo_master):
    older = DepositFactory(account=demo_master, age=timedelta(days=5))
    DepositFactory(account=demo_master, age=timedelta(days=1))
    end = _ms(timezone.now() - timedelta(days=2))
    assert _ids(master_client.get(DEPOSITS, {"endTime": end})) == [older.pk]


@pytest.mark.parametrize("span_ms", [90 * DAY_MS, 90 * DAY_MS + 1, 365 * DAY_MS])
def test_deposit_period_90_days_or_more(master_client, demo_master, span_ms):
    end = _ms(timezone.now())
    assert_error(master_client.get(DEPOSITS, {"startTime": end - span_ms, "endTime": end}), -1025, 400)


def test_deposit_period_just_under_90_days(master_client, demo_master):
    deposit = DepositFactory(account=demo_master, age=timedelta(days=89, hours=23))
    end = _ms(timezone.now())
    assert _ids(master_client.get(DEPOSITS, {"startTime": end - 90 * DAY_MS + 1, "endTime": end})) == [deposit.pk]


def test_deposit_end_before_start(master_client, demo_master):
    now = _ms(timezone.now())
    assert_error(master_client.get(DEPOSITS, {"startTime": now, "endTime": now - 1}), -1025, 400)


@pytest.mark.parametrize("params", [{"startTime": -1}, {"endTime": "abc"}, {"startTime": "1.5"}])
def test_deposit_bad_times(master_client, params):
    assert_error(master_client.get(DEPOSITS, params), -1025, 400)


# --- deposit history: paging -------------------------------------------------------------------


def test_deposit_offset_and_limit(master_client, demo_master):
    deposits = [DepositFactory(account=demo_master, age=timedelta(hours=10 - i)) for i in range(5)]
    ids = [d.pk for d in deposits]
    assert _ids(master_client.get(DEPOSITS)) == ids
    assert _ids(master_client.get(DEPOSITS, {"limit": 2})) == ids[:2]
    assert _ids(master_client.get(DEPOSITS, {"offset": 2, "limit": 2})) == ids[2:4]
    assert _ids(master_client.get(DEPOSITS, {"offset": 4})) == ids[4:]
    assert _ids(master_client.get(DEPOSITS, {"offset": 5})) == []
    assert _ids(master_client.get(DEPOSITS, {"limit": 1000})) == ids


@pytest.mark.parametrize("params", [{"limit": 1001}, {"limit": 0}, {"limit": -1}, {"offset": -1}, {"offset": "x"}])
def test_deposit_bad_paging(master_client, params):
    assert_error(master_client.get(DEPOSITS, params), -1025, 400)


def test_deposit_limit_defaults_to_1000(master_client, demo_master):
    network = _network()
    now = timezone.now()
    Deposit.objects.bulk_create(
        Deposit(
            account=demo_master,
            network=network,
            address="TBulk",
            amount=Decimal(1),
            tx_id=f"bulk{i}",
            status=DepositStatus.SUCCESS,
            inserted_at=now,
        )
        for i in range(1001)
    )
    first = master_client.get(DEPOSITS).json()
    assert len(first) == 1000
    rest = master_client.get(DEPOSITS, {"offset": 1000}).json()
    assert len(rest) == 1
    assert {r["id"] for r in first} | {r["id"] for r in rest} == {
        str(pk) for pk in Deposit.objects.values_list("pk", flat=True)
    }


# --- withdrawal history ------------------------------------------------------------------------


def test_withdrawal_record_fields_and_types(master_client, demo_master):
    withdrawal = WithdrawalFactory(
        account=demo_master, withdraw_order_id="wo-1", tx_id="ab" * 32, confirmations=4, info=""
    )
    pending = WithdrawalFactory(account=demo_master, stage=WithdrawalStage.QUEUED)
    records = master_client.get(WITHDRAWALS).json()
    assert len(records) == 2
    record = records[0]
    assert set(record) == {
        "id",
        "address",
        "addressTag",
        "amount",
        "applyTime",
        "coin",
        "confirmNo",
        "info",
        "network",
        "status",
        "transactionFee",
        "txId",
        "withdrawOrderId",
    }
    assert record == {
        "id": str(withdrawal.pk),
        "address": TRX_ADDRESS,
        "addressTag": "",
        "amount": "10.000000",
        "applyTime": _ms(withdrawal.applied_at),
        "coin": "USDT",
        "confirmNo": 4,
        "info": "",
        "network": "TRX",
        "status": 1,
        "transactionFee": "1.000000",
        "txId": "ab" * 32,
        "withdrawOrderId": "wo-1",
    }
    for name in set(record) - {"applyTime", "confirmNo", "status"}:
        assert isinstance(record[name], str), name
    for name in ("applyTime", "confirmNo", "status"):
        assert type(record[name]) is int, name
    # Empty, not null, when there is no transaction or client id yet.
    assert records[1]["id"] == str(pending.pk)
    assert records[1]["txId"] == ""
    assert records[1]["withdrawOrderId"] == ""
    assert records[1]["status"] == 0
    assert ledger_check().ok


def test_withdrawal_status_filter(master_client, demo_master):
    processing = [
        WithdrawalFactory(account=demo_master, stage=stage)
        for stage in (WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING)
    ]
    succeeded = WithdrawalFactory(account=demo_master, stage=WithdrawalStage.SUCCEEDED)
    failed = WithdrawalFactory(account=demo_master, stage=WithdrawalStage.FAILED)
    assert _ids(master_client.get(WITHDRAWALS, {"status": 0})) == [w.pk for w in processing]
    assert _ids(master_client.get(WITHDRAWALS, {"status": 1})) == [succeeded.pk]
    assert _ids(master_client.get(WITHDRAWALS, {"status": 2})) == [failed.pk]
    assert [r["status"] for r in master_client.get(WITHDRAWALS).json()] == [0, 0, 0, 1, 2]


@pytest.mark.parametrize("status", [3, 4, -1, "x"])
def test_withdrawal_invalid_status(master_client, status):
    assert_error(master_client.get(WITHDRAWALS, {"status": status}), -1025, 400)


def test_withdrawal_filters_coin_and_order_id(master_client, demo_master, peer):
    usdt = WithdrawalFactory(account=demo_master, withdraw_order_id="a")
    eth = WithdrawalFactory(
        account=demo_master, coin="ETH", network="ETH", address="0x" + "0" * 40, amount=Decimal("0.1")
    )
    WithdrawalFactory(account=peer.user, withdraw_order_id="a")
    assert _ids(master_client.get(WITHDRAWALS, {"coin": "ETH"})) == [eth.pk]
    assert _ids(master_client.get(WITHDRAWALS, {"withdrawOrderId": "a"})) == [usdt.pk]
    assert _ids(master_client.get(WITHDRAWALS, {"withdrawOrderId": "b"})) == []
    assert _ids(master_client.get(WITHDRAWALS)) == [usdt.pk, eth.pk]


def test_withdrawal_ascending(master_client, demo_master):
    a = WithdrawalFactory(account=demo_master, age=timedelta(days=1))
    b = WithdrawalFactory(account=demo_master, age=timedelta(days=3))
    c = WithdrawalFactory(account=demo_master, age=timedelta(minutes=1))
    assert _ids(master_client.get(WITHDRAWALS)) == [b.pk, a.pk, c.pk]


def test_withdrawal_default_90_days(master_client, demo_master):
    old = WithdrawalFactory(account=demo_master, age=timedelta(days=91))
    recent = WithdrawalFactory(account=demo_master, age=timedelta(days=89))
    assert _ids(master_client.get(WITHDRAWALS)) == [recent.pk]
    now = timezone.now()
    window = {"startTime": _ms(now - timedelta(days=95)), "endTime": _ms(now - timedelta(days=10))}
    assert _ids(master_client.get(WITHDRAWALS, window)) == [old.pk, recent.pk]


@pytest.mark.parametrize("span_ms", [90 * DAY_MS, 100 * DAY_MS])
def test_withdrawal_period_90_days_or_more(master_client, span_ms):
    end = _ms(timezone.now())
    assert_error(master_client.get(WITHDRAWALS, {"startTime": end - span_ms, "endTime": end}), -1025, 400)


def test_withdrawal_period_just_under_90_days(master_client):
    end = _ms(timezone.now())
    response = master_client.get(WITHDRAWALS, {"startTime": end - 90 * DAY_MS + 1, "endTime": end})
    assert response.status_code == 200, response.content


def test_withdrawal_end_before_start(master_client):
    now = _ms(timezone.now())
    assert_error(master_client.get(WITHDRAWALS, {"startTime": now, "endTime": now - 1000}), -1025, 400)


def test_withdrawal_paging(master_client, demo_master):
    ids = [WithdrawalFactory(account=demo_master, age=timedelta(hours=10 - i)).pk for i in range(4)]
    assert _ids(master_client.get(WITHDRAWALS, {"offset": 1, "limit": 2})) == ids[1:3]
    assert _ids(master_client.get(WITHDRAWALS, {"offset": 3, "limit": 1000})) == ids[3:]
    assert_error(master_client.get(WITHDRAWALS, {"limit": 1001}), -1025, 400)
    assert_error(master_client.get(WITHDRAWALS, {"limit": 0}), -1025, 400)
    assert_error(master_client.get(WITHDRAWALS, {"offset": -1}), -1025, 400)


def test_withdrawal_limit_defaults_to_1000(master_client, demo_master):
    network = _network()
    Withdrawal.objects.bulk_create(
        Withdrawal(
            account=demo_master,
            network=network,
            address=TRX_ADDRESS,
            amount=Decimal(10),
            fee=Decimal(1),
            stage=WithdrawalStage.SUCCEEDED,
        )
        for _ in range(1001)
    )
    assert len(master_client.get(WITHDRAWALS).json()) == 1000
    assert len(master_client.get(WITHDRAWALS, {"offset": 1000}).json()) == 1


# --- withdrawal history with withdrawOrderId: 7 days -------------------------------------------


def test_order_id_default_last_7_days(master_client, demo_master):
    old = WithdrawalFactory(account=demo_master, withdraw_order_id="wk", age=timedelta(days=8))
    assert _ids(master_client.get(WITHDRAWALS, {"withdrawOrderId": "wk"})) == []
    assert _ids(master_client.get(WITHDRAWALS)) == [old.pk]  # without it: 90 days
    now = timezone.now()
    window = {"startTime": _ms(now - timedelta(days=9)), "endTime": _ms(now - timedelta(days=3))}
    assert _ids(master_client.get(WITHDRAWALS, {"withdrawOrderId": "wk", **window})) == [old.pk]


def test_order_id_within_7_days_listed(master_client, demo_master):
    recent = WithdrawalFactory(account=demo_master, withdraw_order_id="wk", age=timedelta(days=6))
    assert _ids(master_client.get(WITHDRAWALS, {"withdrawOrderId": "wk"})) == [recent.pk]


@pytest.mark.parametrize("span_ms", [7 * DAY_MS, 7 * DAY_MS + 1, 30 * DAY_MS])
def test_order_id_period_7_days_or_more(master_client, span_ms):
    end = _ms(timezone.now())
    response = master_client.get(WITHDRAWALS, {"withdrawOrderId": "wk", "startTime": end - span_ms, "endTime": end})
    assert_error(response, -1025, 400)


def test_order_id_period_just_under_7_days(master_client, demo_master):
    recent = WithdrawalFactory(account=demo_master, withdraw_order_id="wk", age=timedelta(days=6, hours=23))
    end = _ms(timezone.now())
    params = {"withdrawOrderId": "wk", "startTime": end - 7 * DAY_MS + 1, "endTime": end}
    assert _ids(master_client.get(WITHDRAWALS, params)) == [recent.pk]


def test_order_id_too_long(master_client):
    assert_error(master_client.get(WITHDRAWALS, {"withdrawOrderId": "x" * 31}), -1025, 400)


# --- whitelist ---------------------------------------------------------------------------------


def test_whitelist_entries(master_client):
    entries = master_client.get(WHITELIST).json()
    assert {(e["coin"], e["network"]) for e in entries} == {
        ("BTC", "BTC"),
        ("ETH", "ETH"),
        ("USDT", "ETH"),
        ("USDT", "TRX"),
    }
    for entry in entries:
        assert set(entry) == {"address", "addressName", "addressTag", "coin", "network"}
        assert all(isinstance(value, str) for value in entry.values()), entry
    trx = next(e for e in entries if e["network"] == "TRX")
    assert trx == {
        "address": TRX_ADDRESS,
        "addressName": "demo USDT TRX",
        "addressTag": "",
        "coin": "USDT",
        "network": "TRX",
    }


def test_whitelist_filters(master_client):
    def pairs(params):
        response = master_client.get(WHITELIST, params)
        assert response.status_code == 200, response.content
        return sorted((e["coin"], e["network"]) for e in response.json())

    assert pairs({"coin": "USDT"}) == [("USDT", "ETH"), ("USDT", "TRX")]
    assert pairs({"network": "ETH"}) == [("ETH", "ETH"), ("USDT", "ETH")]
    assert pairs({"coin": "USDT", "network": "ETH"}) == [("USDT", "ETH")]
    assert pairs({"address": TRX_ADDRESS}) == [("USDT", "TRX")]
    assert pairs({"address": "0x00000000000000000000000000000000000d3e40"}) == [("ETH", "ETH"), ("USDT", "ETH")]
    assert pairs({"coin": "BTC", "address": TRX_ADDRESS}) == []
    assert pairs({"coin": "DOGE"}) == []


def test_whitelist_only_the_callers(owner, peer):
    peer_client = peer.client
    peer = peer.user
    assert peer_client.get(WHITELIST).json() == []
    WhitelistAddress.objects.create(
        account=peer, network=_network(), address="TPeerAddress11111111111111111111ab", tag="", name="peer's"
    )
    assert [e["addressName"] for e in peer_client.get(WHITELIST).json()] == ["peer's"]


def test_whitelist_with_tag(master_client, demo_master):
    WhitelistAddress.objects.create(
        account=demo_master, network=_network(), address="TTagged111111111111111111111111abc", tag="4242", name="tagged"
    )
    [entry] = master_client.get(WHITELIST, {"address": "TTagged111111111111111111111111abc"}).json()
    assert entry["addressTag"] == "4242"
    assert entry["addressName"] == "tagged"


def test_history_endpoints_are_signed(owner):
    unsigned = owner.client
    for path in (DEPOSITS, WITHDRAWALS, WHITELIST):
        response = unsigned.get(path, signed=False)
        body = assert_error(response, -1105, 400)
        assert "timestamp" in body["msg"]


def test_history_readable_with_a_read_only_key(owner):
    ro = SignedClient.of(ApiKeyFactory(user=owner.user, name="demo-readonly", types=[ApiKeyType.READ_ONLY]))
    for path in (DEPOSITS, WITHDRAWALS, WHITELIST):
        response = ro.get(path)
        assert response.status_code == 200, (path, response.content)
