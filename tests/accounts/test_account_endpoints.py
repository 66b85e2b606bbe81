"""GET /openapi/v1/account, /openapi/account/v3/crypto-accounts and /openapi/v1/asset/transaction/history,
with money put in place through the ledger."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from unittest import mock

import pytest
from django.utils import timezone

from accounts import ledger
from accounts.ledger.posting import api as posting_module
from accounts.models import Asset, Balance, LimitTier, SystemRole, TierLimit
from tests.support.assertions import assert_error
from tests.support.client import SignedClient

pytestmark = pytest.mark.django_db

ACCOUNT = "/openapi/v1/account"
CRYPTO = "/openapi/account/v3/crypto-accounts"
HISTORY = "/openapi/v1/asset/transaction/history"

ACCOUNT_FIELDS = {
    "canTrade",
    "canDeposit",
    "canWithdraw",
    "accountType",
    "updateTime",
    "balances",
    "token",
    "email",
    "enableWithdrawWhitelist",
    "daily",
    "monthly",
    "annually",
    "p2pDaily",
    "p2pMonthly",
    "p2pAnnually",
}
LIMIT_FIELDS = {
    "cashInLimit",
    "cashInRemaining",
    "cashOutLimit",
    "cashOutRemaining",
    "totalWithdrawLimit",
    "totalWithdrawRemaining",
}
DEFAULT_LIMITS = {"daily": "500000.00", "monthly": "5000000.00", "annually": "60000000.00"}
DAY = timedelta(days=1)
_refs = iter(range(1, 10**9))


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def assets(db) -> dict[str, Asset]:
    rows = [
        ("BTC", "Bitcoin", 8, "0.00001", False, "5000000"),
        ("ETH", "Ethereum", 8, "0.0001", False, "200000"),
        ("USDT", "Tether USD", 6, "0.01", False, "58"),
        ("PHP", "Philippine peso", 2, "1", True, "1"),
    ]
    return {
        code: Asset.objects.create(
            code=code,
            name=name,
            transfer_precision=precision,
            transfer_min_quantity=Decimal(minimum),
            is_fiat=fiat,
            reference_price=Decimal(price),
        )
        for code, name, precision, minimum, fiat, price in rows
    }


@pytest.fixture
def uid_limit_raised(settings):
    """History costs UID weight 20 (9 calls a minute); tests that are not about rate limits need more."""
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 100_000
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 100_000


def world() -> int:
    return ledger.system_account_id(SystemRole.WORLD)


def ref(prefix: str = "t") -> str:
    return f"{prefix}:{next(_refs)}"


def deposit(user, code: str, amount: str, kind: str = "CHAIN_DEPOSIT"):
    return ledger.post(legs=ledger.move(world(), user.id, code, Decimal(amount)), kind=kind, reference=ref("dep"))


def post_at(moment: datetime, *, legs, kind: str):
    """A posting made at `moment` (postings are append-only: their time cannot be changed later)."""
    with mock.patch.object(posting_module.timezone, "now", return_value=moment):
        return ledger.post(legs=legs, kind=kind, reference=ref("at"))


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def body(response):
    """The raw JSON with every fractional number as Decimal, checked to hold no non-integer number."""
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    data = json.loads(response.content, parse_float=Decimal)

    def walk(value, path="$"):
        assert not isinstance(value, float | Decimal), f"number with a fraction at {path}: {value!r}"
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(data)
    return data


@pytest.fixture
def customer(make_user, assets):
    return make_user()


@pytest.fixture
def client_of(make_key):
    def make(user, **kwargs) -> SignedClient:
        api_key, secret = make_key(user, **kwargs)
        return SignedClient(api_key.key, secret)

    return make


def account(client: SignedClient) -> dict:
    response = client.get(ACCOUNT)
    assert response.status_code == 200, response.content
    return body(response)


def limits(data: dict, period: str) -> dict[str, Decimal]:
    return {name: Decimal(value) for name, value in data[period].items()}


# --- GET /openapi/v1/account ---------------------------------------------------------------------


def test_account_fields_and_types_for_a_fresh_account(customer, client_of):
    response = client_of(customer).get(ACCOUNT)
    assert response.status_code == 200
    assert response["X-SERVICE-USED-WEIGHT-1M"] == "10"
    assert response["X-SERVICE-USED-UID-WEIGHT-1M"] == "10"
    data = body(response)
    assert set(data) == ACCOUNT_FIELDS
    for flag in ("canTrade", "canDeposit", "canWithdraw", "enableWithdrawWhitelist"):
        assert type(data[flag]) is bool, flag
    assert (data["canTrade"], data["canDeposit"], data["canWithdraw"]) == (True, True, True)
    assert data["enableWithdrawWhitelist"] is False
    assert data["accountType"] == "SPOT"
    assert type(data["updateTime"]) is int
    assert data["updateTime"] == ms(customer.date_joined)  # nothing has changed since the account opened
    assert data["token"] == "PHP"
    assert data["email"] == customer.email
    # Every asset, zero where the account has none, with the asset's precision.
    assert data["balances"] == [
        {"asset": "BTC", "free": "0.00000000", "locked": "0.00000000"},
        {"asset": "ETH", "free": "0.00000000", "locked": "0.00000000"},
        {"asset": "PHP", "free": "0.00", "locked": "0.00"},
        {"asset": "USDT", "free": "0.000000", "locked": "0.000000"},
    ]
    for period, amount in DEFAULT_LIMITS.items():
        assert data[period] == dict.fromkeys(LIMIT_FIELDS, amount), period
    # The default tier (migration 0005) configures no p2p limits.
    assert data["p2pDaily"] is None
    assert data["p2pMonthly"] is None
    assert data["p2pAnnually"] is None


def test_account_flags_token_and_whitelist_come_from_what_operators_set(make_user, assets, client_of):
    user = make_user(
        can_trade=False, can_deposit=True, can_withdraw=False, enable_withdraw_whitelist=True, base_token="USDT"
    )
    data = account(client_of(user))
    assert data["canTrade"] is False
    assert data["canDeposit"] is True
    assert data["canWithdraw"] is False
    assert data["enableWithdrawWhitelist"] is True
    assert data["token"] == "USDT"


def test_account_flags_change_is_seen_on_the_next_request(customer, client_of):
    client = client_of(customer)
    assert account(client)["canDeposit"] is True
    customer.can_deposit = False
    customer.save()
    assert account(client)["canDeposit"] is False


def test_account_balances_and_update_time_after_postings(customer, client_of):
    deposit(customer, "BTC", "1.5")
    deposit(customer, "PHP", "1234.5", kind="FIAT_DEPOSIT")
    last = ledger.post(legs=ledger.hold(customer.id, "BTC", Decimal("0.25")), kind="CHAIN_WITHDRAWAL", reference="h:1")
    data = account(client_of(customer))
    balances = {row["asset"]: row for row in data["balances"]}
    assert balances["BTC"] == {"asset": "BTC", "free": "1.25000000", "locked": "0.25000000"}
    assert balances["PHP"] == {"asset": "PHP", "free": "1234.50", "locked": "0.00"}
    assert balances["ETH"] == {"asset": "ETH", "free": "0.00000000", "locked": "0.00000000"}
    assert balances["USDT"] == {"asset": "USDT", "free": "0.000000", "locked": "0.000000"}
    assert [row["asset"] for row in data["balances"]] == ["BTC", "ETH", "PHP", "USDT"]
    assert type(data["updateTime"]) is int
    assert data["updateTime"] == ms(last.created_at)
    assert data["updateTime"] == ms(Balance.objects.get(account=customer, asset__code="BTC").updated_at)


def test_deposit_reduces_cash_in_remaining_in_every_period(customer, client_of):
    deposit(customer, "BTC", "0.01")  # 0.01 x 5,000,000 PHP = 50,000 PHP
    data = account(client_of(customer))
    assert data["daily"] == {
        "cashInLimit": "500000.00",
        "cashInRemaining": "450000.00",
        "cashOutLimit": "500000.00",
        "cashOutRemaining": "500000.00",
        "totalWithdrawLimit": "500000.00",
        "totalWithdrawRemaining": "500000.00",
    }
    assert data["monthly"]["cashInRemaining"] == "4950000.00"
    assert data["annually"]["cashInRemaining"] == "59950000.00"
    for period in DEFAULT_LIMITS:
        assert data[period]["cashOutRemaining"] == DEFAULT_LIMITS[period]
        assert data[period]["totalWithdrawRemaining"] == DEFAULT_LIMITS[period]


def test_fiat_and_other_asset_deposits_add_up_at_reference_prices(customer, client_of):
    deposit(customer, "PHP", "1000", kind="FIAT_DEPOSIT")  # 1,000
    deposit(customer, "ETH", "0.5")  # 100,000
    deposit(customer, "USDT", "100")  # 5,800
    data = account(client_of(customer))
    assert data["daily"]["cashInRemaining"] == "393200.00"
    assert data["monthly"]["cashInRemaining"] == "4893200.00"


def test_cash_in_remaining_never_goes_below_zero(customer, client_of):
    deposit(customer, "BTC", "1")  # 5,000,000 > the daily 500,000 and equal to the monthly
    data = account(client_of(customer))
    assert data["daily"]["cashInRemaining"] == "0.00"
    assert data["monthly"]["cashInRemaining"] == "0.00"
    assert data["annually"]["cashInRemaining"] == "55000000.00"


def test_withdrawal_hold_uses_cash_out_and_total_withdraw_and_release_restores_them(customer, client_of):
    client = client_of(customer)
    deposit(customer, "BTC", "1")
    ledger.post(legs=ledger.hold(customer.id, "BTC", Decimal("0.01")), kind="CHAIN_WITHDRAWAL", reference="wd:hold")
    data = account(client)
    for period, limit in DEFAULT_LIMITS.items():
        used = Decimal(limit) - Decimal("50000")
        assert Decimal(data[period]["cashOutRemaining"]) == used, period
        assert Decimal(data[period]["totalWithdrawRemaining"]) == used, period
        assert data[period]["cashOutLimit"] == limit
        assert data[period]["totalWithdrawLimit"] == limit
    assert data["daily"]["cashOutRemaining"] == "450000.00"
    assert data["daily"]["totalWithdrawRemaining"] == "450000.00"

    ledger.post(
        legs=ledger.release(customer.id, "BTC", Decimal("0.01")), kind="CHAIN_WITHDRAWAL", reference="wd:release"
    )
    data = account(client)
    for period, limit in DEFAULT_LIMITS.items():
        assert data[period]["cashOutRemaining"] == limit, period
        assert data[period]["totalWithdrawRemaining"] == limit, period


def test_settled_withdrawal_keeps_counting(customer, client_of):
    deposit(customer, "BTC", "1")
    ledger.post(legs=ledger.hold(customer.id, "BTC", Decimal("0.02")), kind="CHAIN_WITHDRAWAL", reference="wd:h")
    ledger.post(
        legs=ledger.settle(customer.id, world(), "BTC", Decimal("0.02")), kind="CHAIN_WITHDRAWAL", reference="wd:s"
    )
    data = account(client_of(customer))
    assert data["daily"]["cashOutRemaining"] == "400000.00"
    assert data["daily"]["totalWithdrawRemaining"] == "400000.00"
    assert data["daily"]["cashInRemaining"] == "0.00"  # the 1 BTC deposit


def test_p2p_transfer_out_uses_cash_out_but_not_total_withdraw(customer, make_user, client_of):
    peer = make_user()
    deposit(customer, "BTC", "0.1")
    ledger.post(legs=ledger.move(customer.id, peer.id, "BTC", Decimal("0.01")), kind="P2P_TRANSFER", reference="p2p:1")
    sender = account(client_of(customer))
    for period, limit in DEFAULT_LIMITS.items():
        assert Decimal(sender[period]["cashOutRemaining"]) == Decimal(limit) - 50000, period
        assert sender[period]["totalWithdrawRemaining"] == limit, period
    assert sender["daily"]["cashOutRemaining"] == "450000.00"
    # The recipient: a transfer received is cash in.
    receiver = account(client_of(peer))
    assert receiver["daily"]["cashInRemaining"] == "450000.00"
    assert receiver["daily"]["cashOutRemaining"] == "500000.00"
    assert receiver["daily"]["totalWithdrawRemaining"] == "500000.00"


def test_deposit_yesterday_counts_in_month_and_year_but_not_today(customer, client_of):
    now = timezone.now()
    yesterday = now - DAY
    post_at(yesterday, legs=ledger.move(world(), customer.id, "BTC", Decimal("0.01")), kind="CHAIN_DEPOSIT")
    data = account(client_of(customer))
    assert data["daily"]["cashInRemaining"] == "500000.00"
    # Calendar periods in UTC: yesterday belongs to this month unless today is the 1st.
    same_month = (yesterday.year, yesterday.month) == (now.year, now.month)
    assert data["monthly"]["cashInRemaining"] == ("4950000.00" if same_month else "5000000.00")
    assert data["annually"]["cashInRemaining"] == ("59950000.00" if yesterday.year == now.year else "60000000.00")


def test_deposit_last_year_counts_nowhere(customer, client_of):
    now = timezone.now()
    post_at(
        now.replace(year=now.year - 1, month=6, day=15),
        legs=ledger.move(world(), customer.id, "BTC", Decimal("0.01")),
        kind="CHAIN_DEPOSIT",
    )
    data = account(client_of(customer))
    for period, limit in DEFAULT_LIMITS.items():
        assert data[period] == dict.fromkeys(LIMIT_FIELDS, limit), period


def test_other_kinds_do_not_use_limits(customer, client_of):
    deposit(customer, "BTC", "0.01", kind="DISTRIBUTION")
    deposit(customer, "BTC", "0.01", kind="OTHERS")
    data = account(client_of(customer))
    for period, limit in DEFAULT_LIMITS.items():
        assert data[period] == dict.fromkeys(LIMIT_FIELDS, limit), period


def test_user_tier_with_p2p_limits_is_used(customer, make_user, client_of):
    tier = LimitTier.objects.create(name="Gold", currency="PHP")
    for period, amount in (("daily", "1000000"), ("monthly", "10000000"), ("annually", "100000000")):
        TierLimit.objects.create(
            tier=tier,
            period=period,
            cash_in_limit=Decimal(amount),
            cash_out_limit=Decimal(amount),
            total_withdraw_limit=Decimal(amount),
        )
    TierLimit.objects.create(
        tier=tier,
        period="p2pDaily",
        cash_in_limit=Decimal("200000"),
        cash_out_limit=Decimal("100000"),
        total_withdraw_limit=Decimal("100000.5"),
    )
    customer.limit_tier = tier
    customer.save()
    peer = make_user()
    deposit(customer, "BTC", "0.1")  # 500,000 in
    ledger.post(legs=ledger.move(customer.id, peer.id, "BTC", Decimal("0.01")), kind="P2P_TRANSFER", reference="p2p:g")

    data = account(client_of(customer))
    assert data["daily"] == {
        "cashInLimit": "1000000.00",
        "cashInRemaining": "500000.00",
        "cashOutLimit": "1000000.00",
        "cashOutRemaining": "950000.00",
        "totalWithdrawLimit": "1000000.00",
        "totalWithdrawRemaining": "1000000.00",
    }
    assert data["monthly"]["cashInLimit"] == "10000000.00"
    assert data["annually"]["cashInLimit"] == "100000000.00"
    # p2p blocks count transfers only: the deposit is not p2p cash in.
    assert data["p2pDaily"] == {
        "cashInLimit": "200000.00",
        "cashInRemaining": "200000.00",
        "cashOutLimit": "100000.00",
        "cashOutRemaining": "50000.00",
        "totalWithdrawLimit": "100000.50",
        "totalWithdrawRemaining": "50000.50",
    }
    assert data["p2pMonthly"] is None
    assert data["p2pAnnually"] is None

    # The peer (default tier) still sees the default limits and no p2p blocks.
    other = account(client_of(peer))
    assert other["daily"]["cashInLimit"] == "500000.00"
    assert other["daily"]["cashInRemaining"] == "450000.00"
    assert other["p2pDaily"] is None


def test_sub_account_key_sees_the_sub_accounts_own_balances(master, make_user, assets, client_of):
    sub = make_user(master=master)
    deposit(master, "BTC", "2")
    deposit(sub, "ETH", "3")
    data = account(client_of(sub))
    assert data["email"] == sub.email
    balances = {row["asset"]: row["free"] for row in data["balances"]}
    assert balances == {"BTC": "0.00000000", "ETH": "3.00000000", "PHP": "0.00", "USDT": "0.000000"}


# --- GET /openapi/account/v3/crypto-accounts -----------------------------------------------------


@pytest.mark.parametrize("recv_window", [None, "", "60000"], ids=["absent", "empty", "60000"])
def test_crypto_accounts_recv_window_is_optional(customer, client_of, recv_window):
    """The official connector's crypto_accounts and the Postman request send recvWindow empty or not
    at all: the clients win over the spec's table (docs/api.md)."""
    params = {} if recv_window is None else {"recvWindow": recv_window}
    response = client_of(customer).get(CRYPTO, params)
    assert response.status_code == 200, response.content
    assert "crypto-accounts" in response.json()


@pytest.mark.parametrize("recv_window", ["5s", "-1", "0"])
def test_crypto_accounts_recv_window_not_a_window_is_invalid(customer, client_of, recv_window):
    error = assert_error(client_of(customer).get(CRYPTO, {"recvWindow": recv_window}), -1025, 400)
    assert "recvWindow" in error["msg"]


def test_crypto_accounts_recv_window_above_60000_is_invalid(customer, client_of):
    assert_error(client_of(customer).get(CRYPTO, {"recvWindow": 60001}), -1025, 400)


def test_crypto_accounts_lists_every_asset_with_free_and_locked(customer, client_of):
    deposit(customer, "BTC", "1.5")
    ledger.post(legs=ledger.hold(customer.id, "BTC", Decimal("0.4")), kind="CHAIN_WITHDRAWAL", reference="h:c")
    response = client_of(customer).get(CRYPTO, {"recvWindow": 5000})
    assert response.status_code == 200, response.content
    assert response["X-SERVICE-USED-WEIGHT-1M"] == "1"
    data = body(response)
    assert set(data) == {"crypto-accounts"}
    assert data["crypto-accounts"] == [
        {
            "id": f"{customer.pk}-BTC",
            "name": "Bitcoin",
            "currency": "BTC",
            "balance": "1.10000000",
            "pending_balance": "0.40000000",
        },
        {
            "id": f"{customer.pk}-ETH",
            "name": "Ethereum",
            "currency": "ETH",
            "balance": "0.00000000",
            "pending_balance": "0.00000000",
        },
        {
            "id": f"{customer.pk}-PHP",
            "name": "Philippine peso",
            "currency": "PHP",
            "balance": "0.00",
            "pending_balance": "0.00",
        },
        {
            "id": f"{customer.pk}-USDT",
            "name": "Tether USD",
            "currency": "USDT",
            "balance": "0.000000",
            "pending_balance": "0.000000",
        },
    ]
    for item in data["crypto-accounts"]:
        assert all(isinstance(value, str) for value in item.values()), item


def test_crypto_accounts_currency_filter_returns_one_item(customer, client_of):
    deposit(customer, "USDT", "12.5")
    data = body(client_of(customer).get(CRYPTO, {"currency": "USDT", "recvWindow": 5000}))
    assert data == {
        "crypto-accounts": [
            {
                "id": f"{customer.pk}-USDT",
                "name": "Tether USD",
                "currency": "USDT",
                "balance": "12.500000",
                "pending_balance": "0.000000",
            }
        ]
    }


def test_crypto_accounts_unknown_currency_is_invalid(customer, client_of):
    error = assert_error(client_of(customer).get(CRYPTO, {"currency": "DOGE", "recvWindow": 5000}), -1025, 400)
    assert "currency" in error["msg"]


# --- GET /openapi/v1/asset/transaction/history ---------------------------------------------------


def history(client: SignedClient, **params):
    return client.get(HISTORY, params)


def ok_history(client: SignedClient, **params) -> dict:
    response = history(client, **params)
    assert response.status_code == 200, response.content
    data = body(response)
    assert set(data) == {"transactions", "meta"}
    return data


def test_history_token_id_is_required(customer, client_of):
    error = assert_error(history(client_of(customer)), -1105, 400)
    assert "tokenId" in error["msg"]


def test_history_unknown_token_id_is_invalid(customer, client_of):
    error = assert_error(history(client_of(customer), tokenId="DOGE"), -1025, 400)
    assert "tokenId" in error["msg"]


def test_history_weight_is_uid_20(customer, client_of):
    response = history(client_of(customer), tokenId="BTC")
    assert response.status_code == 200
    assert response["X-SERVICE-USED-UID-WEIGHT-1M"] == "20"
    assert response["X-SERVICE-USED-WEIGHT-1M"] == "0"


def test_history_items_fields_signs_and_order(customer, make_user, client_of, uid_limit_raised):
    peer = make_user()
    dep = deposit(customer, "BTC", "2")
    p2p = ledger.post(
        legs=ledger.move(customer.id, peer.id, "BTC", Decimal("0.5")), kind="P2P_TRANSFER", reference="p2p:h"
    )
    ledger.post(legs=ledger.hold(customer.id, "BTC", Decimal("0.7")), kind="CHAIN_WITHDRAWAL", reference="wd:h1")
    settle = ledger.post(
        legs=ledger.settle(customer.id, world(), "BTC", Decimal("0.7")), kind="CHAIN_WITHDRAWAL", reference="wd:s1"
    )
    deposit(customer, "ETH", "1")  # another token: not listed
    data = ok_history(client_of(customer), tokenId="BTC")
    assert data["transactions"] == [
        {
            "txId": str(dep.posting_id),
            "bizSubject": "CHAIN_DEPOSIT",
            "status": "SUCCESS",
            "changed": "2.00000000",
            "tokenId": "BTC",
            "time": str(ms(dep.created_at)),
        },
        {
            "txId": str(p2p.posting_id),
            "bizSubject": "P2P_TRANSFER",
            "status": "SUCCESS",
            "changed": "-0.50000000",
            "tokenId": "BTC",
            "time": str(ms(p2p.created_at)),
        },
        {
            "txId": str(settle.posting_id),
            "bizSubject": "CHAIN_WITHDRAWAL",
            "status": "SUCCESS",
            "changed": "-0.70000000",
            "tokenId": "BTC",
            "time": str(ms(settle.created_at)),
        },
    ]
    assert data["meta"] == {"has_next": False}
    for item in data["transactions"]:
        assert all(isinstance(value, str) for value in item.values()), item
        assert item["time"].isdigit()
    # The recipient sees the same transfer as a credit.
    received = ok_history(client_of(peer), tokenId="BTC")["transactions"]
    assert [(t["txId"], t["changed"]) for t in received] == [(str(p2p.posting_id), "0.50000000")]
    assert ok_history(client_of(customer), tokenId="ETH")["transactions"][0]["changed"] == "1.00000000"


def test_history_does_not_list_a_pure_hold_or_release(customer, client_of):
    deposit(customer, "BTC", "1")
    ledger.post(legs=ledger.hold(customer.id, "BTC", Decimal("0.3")), kind="CHAIN_WITHDRAWAL", reference="wd:h2")
    ledger.post(legs=ledger.release(customer.id, "BTC", Decimal("0.3")), kind="CHAIN_WITHDRAWAL", reference="wd:r2")
    data = ok_history(client_of(customer), tokenId="BTC")
    assert [t["bizSubject"] for t in data["transactions"]] == ["CHAIN_DEPOSIT"]


def test_history_of_an_account_without_postings_is_empty(customer, client_of):
    assert ok_history(client_of(customer), tokenId="PHP") == {"transactions": [], "meta": {"has_next": False}}


@pytest.fixture
def dated(customer):
    """Two deposits: 10 days ago (1 BTC) and 3 days ago (2 BTC), at whole milliseconds."""
    now = timezone.now()
    now = now.replace(microsecond=now.microsecond // 1000 * 1000)
    old = post_at(now - 10 * DAY, legs=ledger.move(world(), customer.id, "BTC", Decimal("1")), kind="CHAIN_DEPOSIT")
    recent = post_at(now - 3 * DAY, legs=ledger.move(world(), customer.id, "BTC", Decimal("2")), kind="CHAIN_DEPOSIT")
    return now, str(old.posting_id), str(recent.posting_id)


def _ids(data: dict) -> list[str]:
    return [t["txId"] for t in data["transactions"]]


def test_history_without_times_is_the_last_7_days(customer, client_of, dated):
    _, old, recent = dated
    data = ok_history(client_of(customer), tokenId="BTC")
    assert _ids(data) == [recent]
    assert old not in _ids(data)
    assert data["transactions"][0]["changed"] == "2.00000000"


def test_history_only_start_time_gives_the_7_days_after_it(customer, client_of, dated, uid_limit_raised):
    now, old, recent = dated
    client = client_of(customer)
    assert _ids(ok_history(client, tokenId="BTC", startTime=ms(now - 11 * DAY))) == [old]
    assert _ids(ok_history(client, tokenId="BTC", startTime=ms(now - 4 * DAY))) == [recent]
    assert _ids(ok_history(client, tokenId="BTC", startTime=ms(now - 2 * DAY))) == []


def test_history_only_end_time_gives_the_7_days_before_it(customer, client_of, dated, uid_limit_raised):
    now, old, recent = dated
    client = client_of(customer)
    assert _ids(ok_history(client, tokenId="BTC", endTime=ms(now - 2 * DAY))) == [recent]
    assert _ids(ok_history(client, tokenId="BTC", endTime=ms(now - 9 * DAY))) == [old]
    assert _ids(ok_history(client, tokenId="BTC", endTime=ms(now - 11 * DAY))) == []


def test_history_start_and_end_within_7_days(customer, client_of, dated, uid_limit_raised):
    now, old, recent = dated
    client = client_of(customer)
    # exactly 7 days is allowed
    assert _ids(ok_history(client, tokenId="BTC", startTime=ms(now - 10 * DAY), endTime=ms(now - 3 * DAY))) == [
        old,
        recent,
    ]
    assert _ids(ok_history(client, tokenId="BTC", startTime=ms(now - 4 * DAY), endTime=ms(now))) == [recent]
    assert _ids(ok_history(client, tokenId="BTC", startTime=ms(now - 12 * DAY), endTime=ms(now - 6 * DAY))) == [old]


def test_history_end_time_equal_to_a_transactions_time_includes_it(customer, client_of, uid_limit_raised):
    """A transaction's `time` is its posting time in whole milliseconds; asking for the window that
    ends (or starts) at exactly that millisecond must list it."""
    # between two whole milliseconds, and in the past (now() may be earlier in its second than .123456)
    moment = (timezone.now() - timedelta(seconds=2)).replace(microsecond=123_456)
    posted = post_at(moment, legs=ledger.move(world(), customer.id, "BTC", Decimal("1")), kind="CHAIN_DEPOSIT")
    client = client_of(customer)
    [item] = ok_history(client, tokenId="BTC")["transactions"]
    shown = int(item["time"])
    assert shown == ms(moment)
    assert _ids(ok_history(client, tokenId="BTC", startTime=shown)) == [str(posted.posting_id)]
    assert _ids(ok_history(client, tokenId="BTC", startTime=shown, endTime=shown)) == [str(posted.posting_id)]
    assert _ids(ok_history(client, tokenId="BTC", endTime=shown)) == [str(posted.posting_id)]


def test_history_span_over_7_days_is_invalid(customer, client_of, uid_limit_raised):
    client = client_of(customer)
    end = ms(timezone.now())
    assert_error(history(client, tokenId="BTC", startTime=end - 7 * 86_400_000 - 1, endTime=end), -1025, 400)
    assert_error(history(client, tokenId="BTC", startTime=end - 30 * 86_400_000, endTime=end), -1025, 400)


def test_history_end_before_start_is_invalid(customer, client_of):
    end = ms(timezone.now())
    assert_error(history(client_of(customer), tokenId="BTC", startTime=end, endTime=end - 1), -1025, 400)


def test_history_start_time_near_the_end_of_representable_time_is_not_a_server_error(customer, client_of):
    """startTime 9999-12-31T23:59:59Z parses, but 'the 7 days after it' cannot be represented.
    That is the caller's bad parameter (-1025), not an internal error (-1000, 500)."""
    start = ms(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
    response = history(client_of(customer), tokenId="BTC", startTime=start)
    assert response.status_code != 500, response.content
    assert_error(response, -1025, 400)


def test_history_end_time_at_the_end_of_representable_time_is_an_empty_page(customer, client_of, uid_limit_raised):
    """endTime 9999-12-31T23:59:59Z (alone: the 7 days before it; or with a startTime) is a valid,
    empty window: the posting-id bounds' margin past it cannot be represented and is not sought."""
    end = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    for params in ({"endTime": ms(end)}, {"startTime": ms(end - 3 * DAY), "endTime": ms(end)}):
        response = history(client_of(customer), tokenId="BTC", **params)
        assert response.status_code == 200, response.content
        assert response.json()["transactions"] == []


@pytest.mark.parametrize(
    "params",
    [
        {"pageNum": 0},
        {"pageNum": 1001},
        {"pageSize": 0},
        {"pageSize": 101},
        {"pageNum": "x"},
        {"startTime": "yesterday"},
    ],
)
def test_history_paging_and_time_bounds(customer, client_of, params):
    error = assert_error(history(client_of(customer), tokenId="BTC", **params), -1025, 400)
    assert next(iter(params)) in error["msg"]


def test_history_paging_bounds_accepted(customer, client_of, uid_limit_raised):
    client = client_of(customer)
    for params in ({"pageNum": 1000}, {"pageSize": 100}, {"pageNum": 1, "pageSize": 1}):
        ok_history(client, tokenId="BTC", **params)


def test_history_default_page_size_is_20(customer, client_of, uid_limit_raised):
    results = [deposit(customer, "BTC", f"0.{n:02d}") for n in range(1, 26)]
    ids = [str(r.posting_id) for r in results]
    client = client_of(customer)

    first = ok_history(client, tokenId="BTC")
    assert _ids(first) == ids[:20]
    assert first["meta"] == {"has_next": True, "next_page": 2}
    assert first["transactions"][0]["changed"] == "0.01000000"

    second = ok_history(client, tokenId="BTC", pageNum=2)
    assert _ids(second) == ids[20:]
    assert second["meta"] == {"has_next": False, "previous_page": 1}
    assert second["transactions"][-1]["changed"] == "0.25000000"

    sized = ok_history(client, tokenId="BTC", pageNum=3, pageSize=10)
    assert _ids(sized) == ids[20:]
    assert sized["meta"] == {"has_next": False, "previous_page": 2}

    middle = ok_history(client, tokenId="BTC", pageNum=2, pageSize=10)
    assert _ids(middle) == ids[10:20]
    assert middle["meta"] == {"has_next": True, "next_page": 3, "previous_page": 1}

    exact = ok_history(client, tokenId="BTC", pageSize=25)
    assert _ids(exact) == ids
    assert exact["meta"] == {"has_next": False}

    beyond = ok_history(client, tokenId="BTC", pageNum=4, pageSize=10)
    assert beyond == {"transactions": [], "meta": {"has_next": False, "previous_page": 3}}


def test_history_sub_user_id_of_own_sub_account(master, make_user, assets, client_of, uid_limit_raised):
    sub = make_user(master=master)
    deposit(master, "BTC", "5")
    transfer = ledger.post(
        legs=ledger.move(master.id, sub.id, "BTC", Decimal("1.25")), kind="OTHERS", reference="sub:transfer"
    )
    client = client_of(master)
    sub_history = ok_history(client, tokenId="BTC", subUserId=sub.pk)
    assert sub_history["transactions"] == [
        {
            "txId": str(transfer.posting_id),
            "bizSubject": "OTHERS",
            "status": "SUCCESS",
            "changed": "1.25000000",
            "tokenId": "BTC",
            "time": str(ms(transfer.created_at)),
        }
    ]
    own = ok_history(client, tokenId="BTC")
    assert [t["changed"] for t in own["transactions"]] == ["5.00000000", "-1.25000000"]


def test_history_sub_user_id_of_another_account_is_refused(master, make_user, assets, client_of, uid_limit_raised):
    other_master = make_user()
    others_sub = make_user(master=other_master)
    stranger = make_user()
    deposit(others_sub, "BTC", "1")
    deposit(stranger, "BTC", "1")
    client = client_of(master)
    assert_error(history(client, tokenId="BTC", subUserId=others_sub.pk), -1152, 401)
    assert_error(history(client, tokenId="BTC", subUserId=stranger.pk), -1152, 401)
    assert_error(history(client, tokenId="BTC", subUserId=999_999_999), -1152, 401)
    assert_error(history(client, tokenId="BTC", subUserId=master.pk), -1152, 401)  # not its own sub-account
    assert_error(history(client, tokenId="BTC", subUserId=0), -1025, 400)


def test_sub_account_key_cannot_read_its_master(master, make_user, assets, client_of, uid_limit_raised):
    sub = make_user(master=master)
    deposit(master, "BTC", "1")
    deposit(sub, "BTC", "0.5")
    client = client_of(sub)
    assert_error(history(client, tokenId="BTC", subUserId=master.pk), -1152, 401)
    assert [t["changed"] for t in ok_history(client, tokenId="BTC")["transactions"]] == ["0.50000000"]
