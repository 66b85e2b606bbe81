"""POST /openapi/wallet/v1/withdraw/apply: every check, each refusal with its code and HTTP status,
and nothing held when refused."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.ledger.check import ledger_check
from accounts.models import ApiKeyType, Balance, LimitTier, Posting, TierLimit
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import NetworkFactory, UserFactory, WhitelistAddressFactory, demo_networks, fund
from wallet.models import Network, WhitelistAddress, Withdrawal, WithdrawalStage

pytestmark = pytest.mark.django_db

APPLY = "/openapi/wallet/v1/withdraw/apply"
TRX_ADDRESS = "TA1iceWhite1istAddress111111111111"  # matches ^T[1-9A-HJ-NP-Za-km-z]{33}$
TRX_OTHER = "TBobWhite1istAddress11111111111111"
ETH_ADDRESS = "0x" + "a1" * 20
ETH_OTHER = "0x" + "b2" * 20


@pytest.fixture(autouse=True)
def _networks(db):
    """The demo world's assets and networks (USDT on TRX and ETH, ETH on ETH), without its accounts."""
    demo_networks()


@pytest.fixture(autouse=True)
def _roomy_rate_limits(settings):
    """withdraw/apply weighs 100 against a UID limit of 180: lift the limits for these tests."""
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**6
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 10**6


def _balance(user, code: str) -> tuple[Decimal, Decimal]:
    row = Balance.objects.filter(account=user, asset__code=code).first()
    return (row.free, row.locked) if row else (Decimal(0), Decimal(0))


@pytest.fixture
def alice(make_user):
    """A fresh account holding 1000 USDT and 10 ETH, whitelisted for USDT on TRX and on ETH only."""
    user = make_user()
    fund(user, "USDT", "1000")
    fund(user, "ETH", "10")
    WhitelistAddress.objects.create(
        account=user, network=NetworkFactory(coin__code="USDT", network="TRX"), address=TRX_ADDRESS, name="trx"
    )
    WhitelistAddress.objects.create(
        account=user, network=NetworkFactory(coin__code="USDT", network="ETH"), address=ETH_ADDRESS, name="eth"
    )
    return user


@pytest.fixture
def alice_client(alice, make_key):
    api_key, secret = make_key(alice)
    return SignedClient(api_key.key, secret)


def _apply(client: SignedClient, **params):
    body = {"coin": "USDT", "network": "TRX", "address": TRX_ADDRESS, "amount": "10"}
    body.update({k: v for k, v in params.items() if v is not None})
    for name in [k for k, v in params.items() if v is None]:
        body.pop(name, None)
    return client.post(APPLY, body)


def _nothing_held(user, before_usdt) -> None:
    assert _balance(user, "USDT") == before_usdt
    assert not Withdrawal.objects.filter(account=user).exists()
    assert ledger_check().ok


# --- whitelist ---------------------------------------------------------------------------------


def test_whitelisted_withdrawal_is_accepted(alice_client, alice):
    response = _apply(alice_client, amount="10")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"id"}
    assert isinstance(body["id"], str)
    withdrawal = Withdrawal.objects.get(pk=int(body["id"]))
    assert withdrawal.account == alice
    assert withdrawal.address == TRX_ADDRESS
    assert ledger_check().ok


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({"address": TRX_OTHER}, "wrong address"),
        ({"addressTag": "12345"}, "wrong tag"),
        ({"network": "ETH", "address": TRX_ADDRESS}, "wrong network"),
        ({"coin": "ETH", "network": "ETH", "address": ETH_ADDRESS, "amount": "0.1"}, "wrong coin"),
    ],
)
def test_not_in_whitelist(alice_client, alice, params, why):
    before = _balance(alice, "USDT")
    response = _apply(alice_client, **params)
    body = assert_error(response, -1025, 400)
    assert "whitelist" in body["msg"], why
    _nothing_held(alice, before)


def test_tag_must_match_the_entry(alice_client, alice):
    """An entry with a tag matches only that tag (none or another is refused)."""
    WhitelistAddress.objects.filter(account=alice, address=TRX_ADDRESS).update(tag="777")
    assert_error(_apply(alice_client), -1025, 400)
    assert_error(_apply(alice_client, addressTag="778"), -1025, 400)
    response = _apply(alice_client, addressTag="777")
    assert response.status_code == 200, response.content
    assert Withdrawal.objects.get().tag == "777"
    assert ledger_check().ok


def test_whitelist_of_another_account_does_not_count(alice_client, alice):
    """Another account's whitelisted TRX address is whitelisted for that account, not for alice."""
    WhitelistAddressFactory(
        account=UserFactory(),
        network=NetworkFactory(coin__code="USDT", network="TRX"),
        address="TDemoMasterWhitezistAddress1111111",
    )
    before = _balance(alice, "USDT")
    assert_error(_apply(alice_client, address="TDemoMasterWhitezistAddress1111111"), -1025, 400)
    _nothing_held(alice, before)


@pytest.mark.parametrize(
    ("coin", "network"),
    [("DOGE", "TRX"), ("USDT", "BSC"), ("BTC", "TRX"), ("PHP", "TRX"), ("usdt", "TRX")],
)
def test_unknown_coin_or_network(alice_client, alice, coin, network):
    before = _balance(alice, "USDT")
    assert_error(_apply(alice_client, coin=coin, network=network), -1025, 400)
    _nothing_held(alice, before)


def test_network_withdraw_disabled(alice_client, alice):
    Network.objects.filter(coin__code="USDT", network="TRX").update(withdraw_enable=False)
    before = _balance(alice, "USDT")
    body = assert_error(_apply(alice_client), -1010, 400)
    assert "suspended" in body["msg"]
    _nothing_held(alice, before)
    # The other network of the coin still works.
    response = _apply(alice_client, network="ETH", address=ETH_ADDRESS, amount="10")
    assert response.status_code == 200, response.content


# --- amount rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "hint"),
    [
        ("9.999999", "minimum"),  # TRX minimum 10
        ("1000000.000001", "maximum"),  # maximum 1000000
        ("0", "positive"),
    ],
)
def test_amount_bounds(alice_client, alice, amount, hint):
    before = _balance(alice, "USDT")
    body = assert_error(_apply(alice_client, amount=amount), -1025, 400)
    assert hint in body["msg"]
    _nothing_held(alice, before)


def test_amount_at_the_bounds_is_accepted(alice_client, alice):
    Network.objects.filter(coin__code="USDT", network="TRX").update(withdraw_max=Decimal("20"))
    assert _apply(alice_client, amount="10").status_code == 200
    assert _apply(alice_client, amount="20").status_code == 200
    assert_error(_apply(alice_client, amount="20.000001"), -1025, 400)
    assert Withdrawal.objects.filter(account=alice).count() == 2
    assert ledger_check().ok


def test_amount_not_an_integer_multiple(alice_client, alice):
    Network.objects.filter(coin__code="USDT", network="TRX").update(withdraw_integer_multiple=Decimal("0.5"))
    before = _balance(alice, "USDT")
    body = assert_error(_apply(alice_client, amount="10.25"), -1025, 400)
    assert "multiple" in body["msg"]
    _nothing_held(alice, before)
    assert _apply(alice_client, amount="10.5").status_code == 200


def test_amount_beyond_transfer_precision(alice_client, alice):
    """USDT has 6 decimals; the integer multiple is made finer so that only precision refuses."""
    Network.objects.filter(coin__code="USDT", network="TRX").update(withdraw_integer_multiple=Decimal("0.00000001"))
    before = _balance(alice, "USDT")
    body = assert_error(_apply(alice_client, amount="10.0000001"), -1025, 400)
    assert "decimal" in body["msg"]
    _nothing_held(alice, before)
    # Trailing zeros are not extra precision.
    assert _apply(alice_client, amount="10.000001000").status_code == 200
    assert Withdrawal.objects.get().amount == Decimal("10.000001")


@pytest.mark.parametrize("amount", ["1e5", "-1", "1E5", "abc", "10,5", " 10", "0x10", "Infinity", "NaN"])
def test_amount_malformed(alice_client, alice, amount):
    before = _balance(alice, "USDT")
    assert_error(_apply(alice_client, amount=amount), -1025, 400)
    _nothing_held(alice, before)


# --- fee and hold ------------------------------------------------------------------------------


def test_fee_is_added_and_held_until_settled(alice_client, alice, django_capture_on_commit_callbacks):
    free0, locked0 = _balance(alice, "USDT")
    assert locked0 == 0
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _apply(alice_client, amount="25")
    assert response.status_code == 200, response.content
    withdrawal = Withdrawal.objects.get(pk=int(response.json()["id"]))
    assert withdrawal.amount == Decimal("25")
    assert withdrawal.fee == Decimal("1")  # the TRX network's fee
    assert withdrawal.stage == WithdrawalStage.QUEUED
    assert _balance(alice, "USDT") == (free0 - Decimal("26"), Decimal("26"))
    assert ledger_check().ok
    for callback in callbacks:  # the change feed's notice, then the worker settles
        callback()
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert _balance(alice, "USDT") == (free0 - Decimal("26"), Decimal(0))
    assert ledger_check().ok


# --- account, limits, balance ------------------------------------------------------------------


def test_account_may_not_withdraw(alice_client, alice):
    alice.can_withdraw = False
    alice.save(update_fields=["can_withdraw"])
    before = _balance(alice, "USDT")
    assert_error(_apply(alice_client), -1152, 401)
    _nothing_held(alice, before)


def _tier(alice, period: str, total_withdraw: str, cash_out: str = "100000000") -> LimitTier:
    tier = LimitTier.objects.create(name=f"small-{period}", currency="PHP")
    TierLimit.objects.create(
        tier=tier,
        period=period,
        cash_in_limit=Decimal("100000000"),
        cash_out_limit=Decimal(cash_out),
        total_withdraw_limit=Decimal(total_withdraw),
    )
    alice.limit_tier = tier
    alice.save(update_fields=["limit_tier"])
    return tier


@pytest.mark.parametrize("period", ["daily", "monthly", "annually"])
def test_limit_exceeded(alice_client, alice, period):
    """10 USDT + 1 fee = 11 USDT = 638 PHP (at 58): above a 500 PHP limit."""
    _tier(alice, period, "500")
    before = _balance(alice, "USDT")
    body = assert_error(_apply(alice_client, amount="10"), -1010, 400)
    assert period in body["msg"]
    _nothing_held(alice, before)


@pytest.mark.parametrize("period", ["daily", "monthly", "annually"])
def test_cash_out_limit_exceeded(alice_client, alice, period):
    _tier(alice, period, total_withdraw="100000000", cash_out="500")
    body = assert_error(_apply(alice_client, amount="10"), -1010, 400)
    assert period in body["msg"]
    assert ledger_check().ok


def test_pending_withdrawals_use_the_limit(alice_client, alice):
    """A 1000 PHP daily limit: the first 638 PHP fits, a second one does not (the first is held)."""
    _tier(alice, "daily", "1000")
    assert _apply(alice_client, amount="10").status_code == 200
    body = assert_error(_apply(alice_client, amount="10"), -1010, 400)
    assert "daily" in body["msg"]
    assert Withdrawal.objects.filter(account=alice).count() == 1
    assert ledger_check().ok


def test_limit_includes_the_fee(alice_client, alice):
    """10 USDT alone is 580 PHP (fits 600); with the 1 USDT fee it is 638 (does not)."""
    _tier(alice, "daily", "600")
    assert_error(_apply(alice_client, amount="10"), -1010, 400)
    _tier_limit = TierLimit.objects.get(tier=alice.limit_tier)
    _tier_limit.total_withdraw_limit = Decimal("638")
    _tier_limit.save()
    assert _apply(alice_client, amount="10").status_code == 200
    assert ledger_check().ok


def test_balance_insufficient(alice_client, alice):
    """1000 USDT: 999 + 1 fee fits exactly; 1000 + 1 fee does not, and nothing changes."""
    before = _balance(alice, "USDT")
    postings = Posting.objects.count()
    assert_error(_apply(alice_client, amount="1000"), -1131, 400)
    _nothing_held(alice, before)
    assert Posting.objects.count() == postings
    response = _apply(alice_client, amount="999")
    assert response.status_code == 200, response.content
    assert _balance(alice, "USDT") == (Decimal(0), Decimal("1000"))
    assert ledger_check().ok


# --- withdrawOrderId ---------------------------------------------------------------------------


def test_withdraw_order_id_too_long(alice_client, alice):
    before = _balance(alice, "USDT")
    assert_error(_apply(alice_client, withdrawOrderId="x" * 31), -1025, 400)
    _nothing_held(alice, before)
    response = _apply(alice_client, withdrawOrderId="y" * 30)
    assert response.status_code == 200, response.content
    assert Withdrawal.objects.get().withdraw_order_id == "y" * 30


def test_withdraw_order_id_twice(alice_client, alice):
    free0, _ = _balance(alice, "USDT")
    first = _apply(alice_client, withdrawOrderId="order-1")
    assert first.status_code == 200, first.content
    body = assert_error(_apply(alice_client, withdrawOrderId="order-1", amount="20"), -1010, 400)
    assert "withdrawOrderId" in body["msg"]
    assert Withdrawal.objects.filter(account=alice).count() == 1
    assert Posting.objects.filter(reference__endswith=":hold", reference__startswith="withdrawal:").count() == 1
    free, locked = _balance(alice, "USDT")
    assert locked in (Decimal(11), Decimal(0))  # one hold (settled or not)
    assert free == free0 - Decimal(11)
    assert ledger_check().ok


def test_withdraw_order_id_is_per_account(alice_client, alice, make_user, make_key):
    bob = make_user()
    fund(bob, "USDT", "100")
    WhitelistAddress.objects.create(
        account=bob, network=NetworkFactory(coin__code="USDT", network="TRX"), address=TRX_ADDRESS
    )
    api_key, secret = make_key(bob)
    bob_client = SignedClient(api_key.key, secret)
    assert _apply(alice_client, withdrawOrderId="shared").status_code == 200
    assert _apply(bob_client, withdrawOrderId="shared").status_code == 200
    assert Withdrawal.objects.filter(withdraw_order_id="shared").count() == 2
    assert ledger_check().ok


# --- keys and parameters -----------------------------------------------------------------------


def test_read_only_key(alice, make_key):
    api_key, secret = make_key(alice, types=[ApiKeyType.READ_ONLY], name="ro")
    before = _balance(alice, "USDT")
    assert_error(_apply(SignedClient(api_key.key, secret)), -1020, 401)
    _nothing_held(alice, before)


@pytest.mark.parametrize(
    "types", [[ApiKeyType.SPOT], [ApiKeyType.CONVERT, ApiKeyType.FIAT, ApiKeyType.ACCOUNT, ApiKeyType.SPOT]]
)
def test_key_without_crypto_wallet_type(alice, make_key, types):
    api_key, secret = make_key(alice, types=types, name="no-wallet")
    before = _balance(alice, "USDT")
    body = assert_error(_apply(SignedClient(api_key.key, secret)), -2019, 401)
    assert "Enable Crypto Wallet" in body["msg"]
    _nothing_held(alice, before)


def test_key_with_only_crypto_wallet_type(alice, make_key):
    api_key, secret = make_key(alice, types=[ApiKeyType.CRYPTO_WALLET], name="wallet-only")
    assert _apply(SignedClient(api_key.key, secret)).status_code == 200
    assert ledger_check().ok


@pytest.mark.parametrize("missing", ["coin", "network", "address", "amount"])
def test_missing_required_parameter(alice_client, alice, missing):
    before = _balance(alice, "USDT")
    body = assert_error(_apply(alice_client, **{missing: None}), -1105, 400)
    assert missing in body["msg"]
    _nothing_held(alice, before)


def test_parameters_in_the_query_string(alice_client, alice):
    """The connector may send everything in the query string of the POST."""
    response = alice_client.post(APPLY, {"coin": "USDT", "network": "TRX", "address": TRX_ADDRESS, "amount": "10"})
    assert response.status_code == 200, response.content
    response = alice_client.request(
        "POST", APPLY, None, body={"coin": "USDT", "network": "TRX", "address": TRX_ADDRESS, "amount": "11"}
    )
    assert response.status_code == 200, response.content
    assert sorted(w.amount for w in Withdrawal.objects.filter(account=alice)) == [Decimal(10), Decimal(11)]
    assert ledger_check().ok
