"""H1 of the security review (docs/security.md): money leaves an account only with a key of the
asset's fund-moving type, never from a frozen, deactivated or withdrawal-barred account, never to a
frozen one, and never in an asset without a reference price. One place decides (accounts/policy.py);
every refusal is the envelope, and nothing moves."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.ledger.check import ledger_check
from accounts.ledger.errors import AccountMayNotSend
from accounts.ledger.models import Asset, Posting
from accounts.models import ApiKeyType, Balance, User
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import demo_accounts
from wallet.models import Transfer, Withdrawal
from wallet.transfers import services as transfer_services

V4 = "/openapi/transfer/v4/transfers"
V3 = "/openapi/transfer/v3/transfers"
WITHDRAW = "/openapi/wallet/v1/withdraw/apply"
MASTER = "master@demo.exchange"
PEER = "peer@demo.exchange"
BTC_WHITELISTED = "bc1qdemo0master0whitelist0address0000000"


@pytest.fixture(autouse=True)
def _raised_limits(db, settings):
    """The demo's accounts, networks and master's whitelist (the factories' demo_accounts)."""
    demo_accounts(wallet=True)
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000


def everything():
    """Everything a transfer or a withdrawal could change."""
    return (
        sorted(Balance.objects.values_list("account_id", "asset__code", "free", "locked")),
        Transfer.objects.count(),
        Withdrawal.objects.count(),
        Posting.objects.count(),
    )


def refused(client, path, params, code, status) -> dict:
    before = everything()
    body = assert_error(client.post(path, params), code, status)
    assert everything() == before
    assert ledger_check().ok
    return body


def client_with(email: str, make_key, types=None) -> SignedClient:
    api_key, secret = make_key(User.objects.get(email=email), types=types, name="security")
    return SignedClient(api_key.key, secret)


def set_flags(email: str, **flags) -> None:
    user = User.objects.get(email=email)
    for name, value in flags.items():
        setattr(user, name, value)
    user.save()  # a save, as the admin does: every process's key cache forgets the account


# --- the review's reproduction ------------------------------------------------------------------


@pytest.mark.parametrize("path", [V4, V3])
def test_frozen_barred_account_with_a_convert_only_key_cannot_send(make_key, path):
    client = client_with(PEER, make_key, types=[ApiKeyType.CONVERT])
    set_flags(PEER, is_frozen=True, can_withdraw=False)
    params = {"account": "PHP", "target_address": MASTER, "amount": "1000.00"}
    body = refused(client, path, params, -2015, 401)
    assert "frozen" in body["msg"]


# --- key types ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "asset", "amount"),
    [
        ([ApiKeyType.CONVERT], "PHP", "10"),
        ([ApiKeyType.SPOT], "PHP", "10"),
        ([ApiKeyType.ACCOUNT], "PHP", "10"),
        ([ApiKeyType.CRYPTO_WALLET], "PHP", "10"),  # crypto wallet does not move fiat
        ([ApiKeyType.FIAT], "BTC", "0.001"),  # fiat does not move crypto
        ([ApiKeyType.SPOT, ApiKeyType.CONVERT], "USDT", "1"),
    ],
)
def test_transfer_needs_the_assets_fund_moving_key_type(make_key, types, asset, amount):
    client = client_with(PEER, make_key, types=types)
    body = refused(client, V4, {"account": asset, "target_address": MASTER, "amount": amount}, -2019, 401)
    needed = "Enable Fiat" if asset == "PHP" else "Enable Crypto Wallet"
    assert needed in body["msg"]


@pytest.mark.parametrize(
    ("types", "asset", "amount"),
    [([ApiKeyType.FIAT], "PHP", "10"), ([ApiKeyType.CRYPTO_WALLET], "BTC", "0.001"), (None, "USDT", "1")],
)
def test_transfer_with_the_matching_key_type_goes_through(make_key, types, asset, amount):
    client = client_with(PEER, make_key, types=types)
    response = client.post(V4, {"account": asset, "target_address": MASTER, "amount": amount})
    assert response.status_code == 200, response.content
    assert response.json()["transfer"]["status"] == "success"
    assert ledger_check().ok


def test_read_only_key_is_still_1020(make_key):
    client = client_with(PEER, make_key, types=[ApiKeyType.READ_ONLY])
    refused(client, V4, {"account": "PHP", "target_address": MASTER, "amount": "1"}, -1020, 401)


# --- the account's state --------------------------------------------------------------------------


def test_withdrawal_bar_stops_transfers_too(make_key):
    client = client_with(PEER, make_key)
    set_flags(PEER, can_withdraw=False)
    refused(client, V4, {"account": "PHP", "target_address": MASTER, "amount": "10"}, -1152, 401)


@pytest.mark.parametrize("path", ["/openapi/v1/account", "/openapi/v1/api-keys"])
def test_frozen_accounts_keys_are_refused_everywhere(make_key, path):
    client = client_with(PEER, make_key)
    assert client.get(path).status_code == 200
    set_flags(PEER, is_frozen=True)
    assert "frozen" in assert_error(client.get(path), -2015, 401)["msg"]
    set_flags(PEER, is_frozen=False)  # unfrozen: the same key works again
    assert client.get(path).status_code == 200


def test_frozen_account_cannot_withdraw(make_key):
    client = client_with(MASTER, make_key)
    set_flags(MASTER, is_frozen=True)
    params = {"coin": "BTC", "network": "BTC", "address": BTC_WHITELISTED, "amount": "0.01"}
    refused(client, WITHDRAW, params, -2015, 401)


@pytest.mark.parametrize("flags", [{"is_frozen": True}, {"is_active": False}])
def test_frozen_or_deactivated_recipient_receives_nothing(make_key, flags):
    client = client_with(MASTER, make_key)
    set_flags(PEER, **flags)
    body = refused(client, V4, {"account": "PHP", "target_address": PEER, "amount": "10"}, -1151, 404)
    assert "frozen" not in body["msg"]  # the sender is not told why (no tipping off)


@pytest.mark.parametrize(
    "flags", [{"is_frozen": True}, {"is_active": False}, {"can_withdraw": False}], ids=["frozen", "inactive", "barred"]
)
def test_the_service_itself_refuses_a_sender_that_may_not_send(flags):
    """Calls that do not come through the sender's key (operators, jobs, a master acting for its
    sub-account) are refused by the one policy too."""
    set_flags(PEER, **flags)
    before = everything()
    with pytest.raises(AccountMayNotSend):
        transfer_services.transfer_create(
            sender=User.objects.get(email=PEER), asset_code="PHP", target_address=MASTER, amount=Decimal(10)
        )
    assert everything() == before


# --- unpriced assets ------------------------------------------------------------------------------


def test_an_unpriced_asset_cannot_be_moved(make_key):
    Asset.objects.filter(code="USDT").update(reference_price=0)
    from exchange.runtime.ttlcache import clear_all

    clear_all()  # the update above bypassed the save signal that clears cached assets
    client = client_with(MASTER, make_key)
    body = refused(client, V4, {"account": "USDT", "target_address": PEER, "amount": "5"}, -1010, 400)
    assert "reference price" in body["msg"]
    params = {"coin": "USDT", "network": "TRX", "address": "TDemoMasterWhitezistAddress1111111", "amount": "20"}
    refused(client, WITHDRAW, params, -1010, 400)
    asset = Asset.objects.get(code="USDT")
    asset.reference_price = Decimal(58)
    asset.save()  # operators set a price: it moves again
    assert client.post(V4, {"account": "USDT", "target_address": PEER, "amount": "5"}).status_code == 200


# --- a withdrawal applied before the freeze -------------------------------------------------------


def test_a_queued_withdrawal_of_an_account_frozen_since_is_held_not_broadcast(make_key):
    from wallet import approvals as wallet_approvals
    from wallet import settlement as wallet_settlement
    from wallet.models import WithdrawalStage

    client = client_with(MASTER, make_key)
    params = {"coin": "BTC", "network": "BTC", "address": BTC_WHITELISTED, "amount": "0.01"}
    response = client.post(WITHDRAW, params)
    assert response.status_code == 200, response.content
    withdrawal = Withdrawal.objects.get(pk=response.json()["id"])
    assert withdrawal.stage == WithdrawalStage.QUEUED  # its task runs after commit (not in this test)
    locked = Balance.objects.get(account__email=MASTER, asset__code="BTC").locked
    set_flags(MASTER, is_frozen=True)

    held = wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
    assert held.stage == WithdrawalStage.AWAITING_APPROVAL
    assert held.tx_id == ""
    assert "may not send" in held.info
    operator = User.objects.create_superuser("ops@test.example", "pw")
    with pytest.raises(ValueError, match="may not send"):
        wallet_approvals.withdrawal_approve(withdrawal=held, approved_by=operator, reason="checked")
    assert Withdrawal.objects.get(pk=withdrawal.pk).stage == WithdrawalStage.AWAITING_APPROVAL
    rejected = wallet_approvals.withdrawal_reject(withdrawal=held, rejected_by=operator, reason="frozen")
    assert rejected.stage == WithdrawalStage.FAILED
    assert Balance.objects.get(account__email=MASTER, asset__code="BTC").locked == locked - Decimal("0.0105")
    assert ledger_check().ok


# --- the service's own accounts ---------------------------------------------------------------------


def test_system_accounts_never_send_and_have_no_keys():
    """Found in review: an operator could activate a system account (e.g. equity) and give it a key;
    that key then minted money with transfers."""
    from accounts import services as account_services
    from accounts.admin import may_edit_user
    from accounts.models import SystemRole
    from accounts.policy import may_send

    equity = User.objects.get(system_role=SystemRole.EQUITY)
    equity.is_active = True
    assert not may_send(equity)
    with pytest.raises(ValueError, match="system accounts"):
        account_services.api_key_create(user=equity, name="mint")
    operator = User.objects.create_user("operator@test.example", "pw", is_staff=True)
    assert not may_edit_user(operator, equity)


def test_a_key_of_a_system_account_made_behind_the_services_back_is_refused():
    from accounts.crypto import encrypt_secret
    from accounts.models import ApiKey, SystemRole

    equity = User.objects.get(system_role=SystemRole.EQUITY)
    User.objects.filter(pk=equity.pk).update(is_active=True)
    ApiKey.objects.create(user=equity, name="raw", key="RawSystemKey1", secret_ciphertext=encrypt_secret("s3cret"))
    client = SignedClient("RawSystemKey1", "s3cret")
    refused(client, V4, {"account": "PHP", "target_address": PEER, "amount": "40000"}, -2015, 401)


@pytest.mark.parametrize("address", ["639170000002", " 639170000002", "0639170000002", "6391 7000 0002"])
def test_a_recipient_phone_number_must_be_e164(make_key, make_user, address):
    """A lookalike number stored without `+` (or a `+` turned into a space on the way) is never a
    transfer's recipient. The services refuse to store such a number now (accounts/phones.py), so
    it is written raw, as an account from before that rule may hold one."""
    lookalike = make_user()
    User.objects.filter(pk=lookalike.pk).update(phone="639170000002")
    client = client_with(MASTER, make_key)
    refused(client, V4, {"account": "PHP", "target_address": address, "amount": "1"}, -1151, 404)


def test_a_number_with_separators_is_the_same_number(make_key, make_user):
    """Numbers are compared normalised (issue 34): `+63 917 000-0002` is the peer's +639170000002,
    never the lookalike 639170000002 another account holds."""
    lookalike = make_user()
    User.objects.filter(pk=lookalike.pk).update(phone="639170000002")
    client = client_with(MASTER, make_key)
    response = client.post(V4, {"account": "PHP", "target_address": "+63 917 000-0002", "amount": "1"})
    assert response.status_code == 200, response.content
    assert Transfer.objects.get().recipient.email == PEER


def test_a_coin_unpriced_in_the_approval_currency_cannot_be_withdrawn(make_key):
    """Found in review: the limits' currency may be the coin itself (a tier in USDT), but withdrawal
    approvals are valued in PHP: at price 0 no withdrawal of it would ever wait for an operator."""
    from accounts.models import LimitTier
    from exchange.runtime.ttlcache import clear_all

    LimitTier.objects.filter(is_default=True).update(currency="USDT")
    Asset.objects.filter(code="USDT").update(reference_price=0)
    clear_all()
    client = client_with(MASTER, make_key)
    params = {"coin": "USDT", "network": "TRX", "address": "TDemoMasterWhitezistAddress1111111", "amount": "20"}
    assert "reference price" in refused(client, WITHDRAW, params, -1010, 400)["msg"]
