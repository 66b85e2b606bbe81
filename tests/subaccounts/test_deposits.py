"""A sub-account's deposit address and deposit history, asked for by its master (issue 15, item 8):
the wallet's own address, rules and records for the sub-account (the same answers the wallet gives
the sub-account itself), the 90-day window, status 0-3, depositId, txId, offset and limit up to
1000, every ownership boundary (-1151 for any e-mail that is not the caller's sub-account, -1152
for a sub-account calling), and the connector's requests."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts import services as account_services
from accounts.models import ApiKeyType
from exchange.api.ratelimit import USED_UID_WEIGHT_HEADER, USED_WEIGHT_HEADER
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import ApiKeyFactory, DepositFactory, NetworkFactory, customer, demo_networks
from wallet.models import Deposit, DepositAddress, DepositStatus, Network

ADDRESS = "/openapi/v1/sub-account/wallet/deposit/address"
HISTORY = "/openapi/v1/sub-account/wallet/deposit/history"
WALLET_ADDRESS = "/openapi/wallet/v1/deposit/address"
WALLET_HISTORY = "/openapi/wallet/v1/deposit/history"
DAY = timedelta(days=1)
USDT_TRX = {"coin": "USDT", "network": "TRX"}


@pytest.fixture(autouse=True)
def networks(assets) -> list[Network]:
    return demo_networks()


def _ms(moment) -> int:
    return int(moment.timestamp() * 1000)


def _ids(response) -> list[int]:
    return [int(record["id"]) for record in h.ok(response)]


def _sub1(family, **params) -> dict:
    return {"email": family.sub1.user.email, **params}


# --- deposit address ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("coin", "network"), [("BTC", "BTC"), ("USDT", "TRX"), ("USDT", "ETH")])
def test_the_sub_accounts_own_address(family, coin, network):
    """The wallet's address of the sub-account: the one the sub-account gets itself, every time."""
    body = h.ok(family.master.client.get(ADDRESS, _sub1(family, coin=coin, network=network)))
    assert set(body) == {"address", "addressTag", "coin"}
    assert body["coin"] == coin
    assert re.fullmatch(NetworkFactory(coin__code=coin, network=network).address_regex, body["address"])
    stored = DepositAddress.objects.get(network=NetworkFactory(coin__code=coin, network=network))
    assert stored.account_id == family.sub1.user.pk
    assert h.ok(family.sub1.client.get(WALLET_ADDRESS, {"coin": coin, "network": network})) == body
    assert h.ok(family.master.client.get(ADDRESS, _sub1(family, coin=coin, network=network))) == body
    assert DepositAddress.objects.count() == 1


def test_addresses_differ_between_the_family(family):
    master = family.master.client
    of_sub1 = h.ok(master.get(ADDRESS, _sub1(family, **USDT_TRX)))["address"]
    of_sub2 = h.ok(master.get(ADDRESS, {"email": family.sub2.user.email, **USDT_TRX}))["address"]
    own = h.ok(master.get(WALLET_ADDRESS, USDT_TRX))["address"]
    assert len({of_sub1, of_sub2, own}) == 3


def test_address_of_a_frozen_sub_account(family):
    """Shown to its master like the rest of its state (a deposit on the chain cannot be refused;
    the wallet credits a frozen account's deposits as any other's)."""
    account_services.user_set_frozen(user=family.sub1.user, frozen=True)
    assert h.ok(family.master.client.get(ADDRESS, _sub1(family, **USDT_TRX)))["coin"] == "USDT"


def test_address_refused_for_a_disabled_network(family):
    Network.objects.filter(coin__code="USDT", network="TRX").update(deposit_enable=False)
    assert_error(family.master.client.get(ADDRESS, _sub1(family, **USDT_TRX)), -1010, 400)
    assert not DepositAddress.objects.exists()


@pytest.mark.parametrize(("coin", "network"), [("DOGE", "DOGE"), ("PHP", "TRX"), ("USDT", "BSC"), ("BTC", "ETH")])
def test_address_refused_for_unknown_coin_or_network(family, coin, network):
    assert_error(family.master.client.get(ADDRESS, _sub1(family, coin=coin, network=network)), -1025, 400)
    assert not DepositAddress.objects.exists()


@pytest.mark.parametrize("missing", ["email", "coin", "network"])
def test_address_required_parameters(family, missing):
    params = _sub1(family, **USDT_TRX)
    del params[missing]
    assert_error(family.master.client.get(ADDRESS, params), -1105, 400, msg_contains=missing)
    assert not DepositAddress.objects.exists()


# --- deposit history ------------------------------------------------------------------------------------


def test_history_is_the_sub_accounts_only(family, other_family):
    mine = [
        DepositFactory(account=family.sub1.user, age=timedelta(hours=2)),
        DepositFactory(account=family.sub1.user, coin="BTC", network="BTC"),
    ]
    DepositFactory(account=family.sub2.user)
    DepositFactory(account=family.master.user)
    DepositFactory(account=other_family.sub1.user)
    response = family.master.client.get(HISTORY, _sub1(family))
    assert _ids(response) == [d.pk for d in mine]
    # the wallet's own records, exactly as the wallet shows them to the sub-account itself
    assert response.json() == h.ok(family.sub1.client.get(WALLET_HISTORY))


def test_the_record(family):
    deposit = DepositFactory(account=family.sub1.user, amount=Decimal("12.5"), confirmations=7)
    [record] = h.ok(family.master.client.get(HISTORY, _sub1(family)))
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


def test_history_ascending(family):
    user = family.sub1.user
    a, b, c = (DepositFactory(account=user, age=age) for age in (DAY, 3 * DAY, timedelta(hours=1)))
    assert _ids(family.master.client.get(HISTORY, _sub1(family))) == [b.pk, a.pk, c.pk]


def test_history_filters(family):
    user = family.sub1.user
    usdt = DepositFactory(account=user)
    btc = DepositFactory(account=user, coin="BTC", network="BTC", address="bc1qsubdeposit0000000000")
    DepositFactory(account=family.sub2.user, tx_id="f" * 64)
    client = family.master.client
    assert _ids(client.get(HISTORY, _sub1(family, coin="BTC"))) == [btc.pk]
    assert _ids(client.get(HISTORY, _sub1(family, coin="USDT"))) == [usdt.pk]
    assert _ids(client.get(HISTORY, _sub1(family, coin="ETH"))) == []
    assert _ids(client.get(HISTORY, _sub1(family, txId=usdt.tx_id))) == [usdt.pk]
    assert _ids(client.get(HISTORY, _sub1(family, txId="f" * 64))) == []  # the sibling's
    assert _ids(client.get(HISTORY, _sub1(family, depositId=str(btc.pk)))) == [btc.pk]
    assert _ids(client.get(HISTORY, _sub1(family, depositId=str(btc.pk), coin="USDT"))) == []


def test_deposit_id_of_another_account_or_not_a_number(family):
    DepositFactory(account=family.sub1.user)
    of_sibling = DepositFactory(account=family.sub2.user)
    client = family.master.client
    for deposit_id in (str(of_sibling.pk), "abc", "99999999999999999999", "-1", "1.0"):
        assert _ids(client.get(HISTORY, _sub1(family, depositId=deposit_id))) == [], deposit_id


def test_status_filter(family):
    every = {status: DepositFactory(account=family.sub1.user, status=status) for status in (0, 1, 2, 3)}
    for status, deposit in every.items():
        response = family.master.client.get(HISTORY, _sub1(family, status=status))
        assert _ids(response) == [deposit.pk]
        assert response.json()[0]["status"] == status
    assert len(_ids(family.master.client.get(HISTORY, _sub1(family)))) == 4


@pytest.mark.parametrize("status", ["4", "-1", "x", "1,2"])
def test_invalid_status(family, status):
    assert_error(family.master.client.get(HISTORY, _sub1(family, status=status)), -1025, 400, msg_contains="status")


def test_default_window_is_the_last_90_days(family):
    user = family.sub1.user
    DepositFactory(account=user, age=91 * DAY)
    recent = DepositFactory(account=user, age=89 * DAY)
    assert _ids(family.master.client.get(HISTORY, _sub1(family))) == [recent.pk]


def test_explicit_window(family):
    user = family.sub1.user
    old = DepositFactory(account=user, age=100 * DAY)
    middle = DepositFactory(account=user, age=50 * DAY)
    DepositFactory(account=user, age=DAY)
    now = timezone.now()
    client = family.master.client
    window = {"startTime": _ms(now - 120 * DAY), "endTime": _ms(now - 40 * DAY)}
    assert _ids(client.get(HISTORY, _sub1(family, **window))) == [old.pk, middle.pk]
    # only endTime: the 90 days before it
    assert _ids(client.get(HISTORY, _sub1(family, endTime=_ms(now - 40 * DAY)))) == [old.pk, middle.pk]
    # only startTime: from it to now
    assert len(_ids(client.get(HISTORY, _sub1(family, startTime=_ms(now - 60 * DAY))))) == 2


@pytest.mark.parametrize(
    ("start_days_ago", "end_days_ago"),
    [(91, 0), (90, 0), (10, 20)],
)
def test_window_refusals(family, start_days_ago, end_days_ago):
    """Both times at least 90 days apart, or the end before the start: -1025 (as the wallet)."""
    now = timezone.now()
    params = _sub1(family, startTime=_ms(now - start_days_ago * DAY), endTime=_ms(now - end_days_ago * DAY))
    assert_error(family.master.client.get(HISTORY, params), -1025, 400)
    assert_error(family.sub1.client.get(WALLET_HISTORY, {k: v for k, v in params.items() if k != "email"}), -1025, 400)


def test_offset_and_limit(family):
    deposits = [DepositFactory(account=family.sub1.user, age=timedelta(minutes=60 - i)) for i in range(5)]
    ids = [d.pk for d in deposits]
    client = family.master.client
    assert _ids(client.get(HISTORY, _sub1(family, limit=2))) == ids[:2]
    assert _ids(client.get(HISTORY, _sub1(family, offset=2, limit=2))) == ids[2:4]
    assert _ids(client.get(HISTORY, _sub1(family, offset=4))) == ids[4:]
    assert _ids(client.get(HISTORY, _sub1(family, offset=5))) == []
    assert _ids(client.get(HISTORY, _sub1(family, limit=1000))) == ids


@pytest.mark.parametrize("params", [{"limit": 1001}, {"limit": 0}, {"offset": -1}, {"limit": "x"}])
def test_paging_refusals(family, params):
    assert_error(family.master.client.get(HISTORY, _sub1(family, **params)), -1025, 400)


def test_default_limit_is_1000(family):
    now = timezone.now()
    Deposit.objects.bulk_create(
        Deposit(
            account=family.sub1.user,
            network=NetworkFactory(coin__code="USDT", network="TRX"),
            address="TSubDepositBulk",
            amount=Decimal(1),
            tx_id=f"bulk-{i}",
            status=DepositStatus.SUCCESS,
            inserted_at=now,
        )
        for i in range(1001)
    )
    assert len(_ids(family.master.client.get(HISTORY, _sub1(family)))) == 1000
    assert len(_ids(family.master.client.get(HISTORY, _sub1(family, offset=1000)))) == 1


def test_history_requires_the_email(family):
    assert_error(family.master.client.get(HISTORY, {"coin": "USDT"}), -1105, 400, msg_contains="email")


# --- who may ---------------------------------------------------------------------------------------------


CALLS = [(ADDRESS, USDT_TRX), (HISTORY, {})]


@pytest.mark.parametrize(("path", "params"), CALLS)
def test_a_sub_account_cannot_call_them(family, path, params):
    for caller in (family.sub1, family.sub2):
        for target in (family.sub1, family.sub2):
            response = caller.client.get(path, {"email": target.user.email, **params})
            assert_error(response, -1152, 401, msg_contains="master")
    assert not DepositAddress.objects.exists()


@pytest.mark.parametrize(("path", "params"), CALLS)
def test_an_email_that_is_not_the_callers_sub_account(family, other_family, path, params):
    DepositFactory(account=other_family.sub1.user)
    DepositFactory(account=other_family.master.user)
    loner = customer(email="loner@test.example")
    DepositFactory(account=loner.user)
    for email in (
        other_family.sub1.user.email,
        other_family.master.user.email,
        family.master.user.email,  # the master itself: its own are on the wallet's endpoints
        loner.user.email,
        "nobody@test.example",
    ):
        assert_error(family.master.client.get(path, {"email": email, **params}), -1151, 404)
    # an unrelated customer is the master of nobody
    assert_error(loner.client.get(path, {"email": family.sub1.user.email, **params}), -1151, 404)
    assert not DepositAddress.objects.exists()


@pytest.mark.parametrize(("path", "params"), CALLS)
def test_any_key_of_the_master_may_read_them(family, path, params):
    """The wallet's deposit endpoints need no functional key type: a read-only key reads them."""
    read_only = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.READ_ONLY]))
    h.ok(read_only.get(path, _sub1(family, **params)))
    only_spot = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.SPOT]))
    h.ok(only_spot.get(path, _sub1(family, **params)))


@pytest.mark.parametrize(("path", "params"), CALLS)
def test_every_call_is_signed(family, path, params):
    assert_error(family.master.client.get(path, _sub1(family, **params), signature="0" * 64), -1022)
    assert_error(SignedClient(None, "x").get(path, _sub1(family, **params), api_key=None), -1002)


@pytest.mark.parametrize(("path", "params"), CALLS)
def test_weight_is_1(family, path, params):
    client = SignedClient(family.master.api_key.key, family.master.secret, ip="192.0.2.201")
    responses = [client.get(path, _sub1(family, **params)) for _ in range(3)]
    for response in responses:
        h.ok(response)
    ip = [int(r[USED_WEIGHT_HEADER]) for r in responses]
    assert ip[2] - ip[1] == ip[1] - ip[0] == 1
    uid = [int(r[USED_UID_WEIGHT_HEADER]) for r in responses]  # "Weight 1": the IP and the account
    assert uid[2] - uid[1] == uid[1] - uid[0] == 1


# --- the official connector's requests ------------------------------------------------------------------


def test_the_connectors_requests(family):
    """Every parameter in the query string, values as text, the connector's names."""
    deposit = DepositFactory(account=family.sub1.user, status=DepositStatus.SUCCESS)
    client = family.master.client
    address = h.ok(
        client.get(ADDRESS, {"email": family.sub1.user.email, "coin": "USDT", "network": "TRX", "recvWindow": "5000"})
    )
    assert address["coin"] == "USDT"
    now = timezone.now()
    params = {
        "email": family.sub1.user.email,
        "coin": "USDT",
        "txId": deposit.tx_id,
        "depositId": str(deposit.pk),
        "startTime": str(_ms(now - 10 * DAY)),
        "endTime": str(_ms(now + DAY)),
        "limit": "10",
        "offset": "0",
        "status": "1",
        "recvWindow": "5000",
    }
    assert _ids(client.get(HISTORY, params)) == [deposit.pk]
