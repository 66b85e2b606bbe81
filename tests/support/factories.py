"""Factories (factory_boy) that build the world a test needs through the project's own services:
users and API keys as the service creates them, assets and networks as the demo world defines them,
balances funded through the ledger.

    user = UserFactory()                                  # accounts.services.user_create
    api_key, secret = ApiKeyFactory(user=user)            # accounts.services.api_key_create
    fund(user, "PHP", "1000")                             # equity -> user, through ledger.post()
    usdt_trx = NetworkFactory(coin__code="USDT", network="TRX")
    alice = customer(funding={"USDT": "1000"})            # all of it: user, key, client, balances

Assets and networks are got or created by their codes, so a test may ask for them again (or load
the demo world as well) without duplicates; a code the demo world knows gets the demo's attributes.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import factory
from django.utils import timezone
from factory.django import DjangoModelFactory

from accounts import demo as accounts_demo
from accounts import ledger
from accounts import services as account_services
from accounts.ledger.services import funding_post
from accounts.models import ApiKey, ApiKeyType, Asset, SystemRole, User
from convert import demo as convert_demo
from convert import errors as convert_errors
from convert import services as convert_services
from convert.models import Order, Quote
from subaccounts import collection as collection_services
from subaccounts import services as subaccount_services
from subaccounts.models import FundCollection, SubAccountTransfer
from tests.support.client import SignedClient
from wallet import demo as wallet_demo
from wallet import deposits as wallet_deposits
from wallet import settlement as wallet_settlement
from wallet import withdrawals as wallet_withdrawals
from wallet.models import (
    Deposit,
    DepositStatus,
    Network,
    Transfer,
    TransferFee,
    WhitelistAddress,
    Withdrawal,
    WithdrawalStage,
)
from wallet.transfers import services as transfer_services

TEST_PASSWORD = "pw-for-tests"

_references = itertools.count(1)


def _reference(prefix: str) -> str:
    """Unique in a test run and across runs on one database (full-stack tests keep theirs)."""
    return f"{prefix}:{time.time_ns()}:{next(_references)}"


def _amount(value: Decimal | str | int) -> Decimal:
    if isinstance(value, float):
        raise TypeError("money is Decimal (or its text), never float")
    return Decimal(value)


# --- users and keys -------------------------------------------------------------------------------


class UserFactory(DjangoModelFactory):
    """A customer account made by accounts.services.user_create; other fields (`is_staff=True`,
    `is_active=False`, ...) are set afterwards and saved."""

    class Meta:
        model = User

    email = factory.Sequence(lambda n: f"user{n}-{time.time_ns()}@test.example")
    phone = None
    password = TEST_PASSWORD
    master = None

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        made = {
            name: kwargs.pop(name) for name in ("email", "phone", "password", "master", "is_virtual") if name in kwargs
        }
        user = account_services.user_create(**made)
        for field, value in kwargs.items():
            setattr(user, field, value)
        if kwargs:
            user.save()
        return user


class ApiKeyFactory(factory.Factory):
    """An API key made by accounts.services.api_key_create. Returns `(ApiKey, secret)`: the secret
    exists in clear only here, as for a real client."""

    class Meta:
        model = ApiKey

    user = factory.SubFactory(UserFactory)
    name = "test"
    types = None  # every functional type
    ip_list = None
    ip_restrict = None

    @classmethod
    def _create(cls, model_class, *args, **kwargs) -> tuple[ApiKey, str]:
        created = account_services.api_key_create(**kwargs)
        return created.api_key, created.secret


# --- assets and networks --------------------------------------------------------------------------

_DEMO_ASSETS = {
    code: {
        "name": name,
        "transfer_precision": precision,
        "transfer_min_quantity": Decimal(minimum),
        "is_fiat": fiat,
        "reference_price": Decimal(price),
    }
    for code, name, precision, minimum, fiat, price in accounts_demo.ASSETS
}
_DEMO_NETWORKS = {
    (coin, network): {
        "name": name,
        "address_regex": regex,
        "min_confirm": confirmations,
        "withdraw_fee": Decimal(fee),
        "withdraw_min": Decimal(minimum),
        "withdraw_integer_multiple": Decimal(multiple),
        "withdraw_max": Decimal("1000000"),
    }
    for coin, network, name, regex, confirmations, fee, minimum, multiple in wallet_demo.NETWORKS
}


def _demo_asset(field: str, default):
    return factory.LazyAttribute(lambda asset: _DEMO_ASSETS.get(asset.code, {}).get(field, default))


def _demo_network(field: str, default):
    return factory.LazyAttribute(lambda row: _DEMO_NETWORKS.get((row.coin.code, row.network), {}).get(field, default))


class AssetFactory(DjangoModelFactory):
    """`AssetFactory(code="PHP")`: the asset, created if missing (BTC, ETH, USDT and PHP as the demo
    world defines them; another code with neutral attributes unless given)."""

    class Meta:
        model = Asset
        django_get_or_create = ("code",)

    code = factory.Sequence(lambda n: f"TK{n}")
    name = factory.LazyAttribute(lambda asset: _DEMO_ASSETS.get(asset.code, {}).get("name", asset.code))
    transfer_precision = _demo_asset("transfer_precision", 8)
    transfer_min_quantity = _demo_asset("transfer_min_quantity", Decimal(0))
    is_fiat = _demo_asset("is_fiat", False)
    reference_price = _demo_asset("reference_price", Decimal(0))


class NetworkFactory(DjangoModelFactory):
    """`NetworkFactory(coin__code="USDT", network="TRX")`: a coin's network, created if missing (the
    demo world's networks with their fees, limits and address formats)."""

    class Meta:
        model = Network
        django_get_or_create = ("coin", "network")

    coin = factory.SubFactory(AssetFactory, code="BTC")
    network = factory.LazyAttribute(lambda row: row.coin.code)
    name = _demo_network("name", "test network")
    address_regex = _demo_network("address_regex", r"^\S{8,128}$")
    min_confirm = _demo_network("min_confirm", 1)
    withdraw_fee = _demo_network("withdraw_fee", Decimal(0))
    withdraw_min = _demo_network("withdraw_min", Decimal("0.0001"))
    withdraw_integer_multiple = _demo_network("withdraw_integer_multiple", Decimal("0.00000001"))
    withdraw_max = _demo_network("withdraw_max", Decimal("1000000"))


def demo_networks() -> list[Network]:
    """The demo world's assets and networks, without its accounts."""
    return [NetworkFactory(coin__code=coin, network=network) for coin, network in _DEMO_NETWORKS]


class WhitelistAddressFactory(DjangoModelFactory):
    """A withdrawal whitelist entry of `account` for `network`."""

    class Meta:
        model = WhitelistAddress

    account = factory.SubFactory(UserFactory)
    network = factory.SubFactory(NetworkFactory)
    address = factory.LazyAttribute(lambda row: wallet_demo.WHITELIST.get(row.network.network, "whitelisted-address"))
    tag = ""
    name = factory.LazyAttribute(lambda row: f"{row.network.coin.code} {row.network.network}")


# --- balances, through the ledger -----------------------------------------------------------------


def fund(user: User, asset: Asset | str, amount: Decimal | str | int, *, reference: str | None = None) -> None:
    """Credit `user` with `amount` of `asset` (made with AssetFactory when missing) from the equity
    account, through the ledger, as the demo world funds its accounts (a DISTRIBUTION posting)."""
    code = asset.code if isinstance(asset, Asset) else AssetFactory(code=asset).code
    funding_post(
        account=user, asset_code=code, amount=_amount(amount), reference=reference or _reference(f"test:fund:{code}")
    )


def deposit(user: User, amount: Decimal | str | int, asset: str = "BTC", reference: str | None = None):
    """A CHAIN_DEPOSIT of `amount` to `user` from the outside world's account (the asset must
    exist): the posting the wallet makes for a credited deposit, as the streams tests expect it.
    Returns the PostingResult."""
    world = ledger.shard_account_id(SystemRole.WORLD, user.id)  # the customer's shard, as the wallet posts
    return ledger.post(
        legs=ledger.move(world, user.id, asset, _amount(amount)),
        kind="CHAIN_DEPOSIT",
        reference=reference or _reference(f"dep:{user.id}:{asset}"),
    )


# --- a customer with a key and a client -----------------------------------------------------------


@dataclass
class Customer:
    user: User
    api_key: ApiKey
    secret: str
    client: SignedClient


def customer(
    *, funding: dict[str, Decimal | str] | None = None, key_types: list[str] | None = None, **user
) -> Customer:
    """A customer account (`user`: UserFactory fields, e.g. email or phone) with an API key of
    `key_types` (every functional type by default), its signed client, and its balances funded
    through the ledger (`{"PHP": "1000", ...}`)."""
    account = UserFactory(**user)
    api_key, secret = ApiKeyFactory(user=account, types=key_types)
    for code, amount in (funding or {}).items():
        fund(account, code, amount)
    return Customer(account, api_key, secret, SignedClient(api_key.key, secret))


# --- money movements, through the services ----------------------------------------------------------
#
# Each factory makes its rows the way the service does and moves money only through the service's
# own posting (never a balance or journal row written here), so the ledger check passes after any
# of them. What is not money (a timestamp, a chain's tx id, a stage that holds the same funds) may
# be set afterwards on the row, to build a history. `funded=True` credits the payer first (`fund`).


def _age(model, row, field: str, age: timedelta | None):
    if age is not None:
        model.objects.filter(pk=row.pk).update(**{field: timezone.now() - age})
        row.refresh_from_db()
    return row


def _unique_hex() -> str:
    return f"{time.time_ns():048x}{next(_references):016x}"


class DepositFactory(factory.Factory):
    """A deposit the chain showed (the row as deposit_record writes it, to any address), moved along
    by wallet.deposits.deposit_advance: `status=SUCCESS` (the default) credits it through the
    wallet's CHAIN_DEPOSIT posting; PROCESSING, NEED_FILL_DATA and FAILED credit nothing.
    `age=timedelta(...)` dates it back (inserted_at); `confirmations` is what the record shows.

        DepositFactory(account=user, amount=Decimal("12.5"), coin="BTC", network="BTC")
    """

    class Meta:
        model = Deposit

    account = factory.SubFactory(UserFactory)
    coin = "USDT"
    network = "TRX"
    amount = Decimal(5)
    address = factory.Sequence(lambda n: f"TTestDeposit{n:022d}")
    tag = ""
    tx_id = factory.LazyFunction(_unique_hex)
    output_index = 0
    confirmations = 3
    status = DepositStatus.SUCCESS
    age = None

    @classmethod
    def _create(cls, model_class, *args, coin, network, status, age, confirmations, **fields) -> Deposit:
        net = NetworkFactory(coin__code=coin, network=network)
        fields["amount"] = _amount(fields["amount"])
        pending = DepositStatus.NEED_FILL_DATA if status == DepositStatus.NEED_FILL_DATA else DepositStatus.PROCESSING
        deposit = Deposit.objects.create(
            network=net,
            status=pending,
            travel_rule_required=pending == DepositStatus.NEED_FILL_DATA,
            confirmations=max(confirmations, net.min_confirm) if status == DepositStatus.SUCCESS else confirmations,
            **fields,
        )
        if status in (DepositStatus.SUCCESS, DepositStatus.FAILED):
            deposit = wallet_deposits.deposit_advance(deposit=deposit, failed=status == DepositStatus.FAILED)
            assert deposit.status == status, deposit.status
        if deposit.confirmations != confirmations:  # what the record shows; no money in it
            Deposit.objects.filter(pk=deposit.pk).update(confirmations=confirmations)
            deposit.refresh_from_db()
        return _age(Deposit, deposit, "inserted_at", age)


class WithdrawalFactory(factory.Factory):
    """A withdrawal applied by wallet.withdrawals.withdrawal_apply (the address whitelisted and, with
    `funded=True`, amount plus fee funded first), then taken to `stage`: SUCCEEDED (the default)
    broadcast and settled by withdrawal_process on the simulated chain, FAILED failed and released
    by wallet.settlement.fail_and_release as a rejection is (no staff member), QUEUED as applied
    (handed to the worker on commit); AWAITING_APPROVAL and BROADCASTING hold the same funds as
    QUEUED, so only the stage is set. `tx_id`, `confirmations`, `info` and `age`
    (applied_at) are set afterwards when given.

        WithdrawalFactory(account=user, withdraw_order_id="wo-1", stage=WithdrawalStage.QUEUED)
    """

    class Meta:
        model = Withdrawal

    account = factory.SubFactory(UserFactory)
    coin = "USDT"
    network = "TRX"
    address = factory.LazyAttribute(lambda row: wallet_demo.WHITELIST.get(row.network, "whitelisted-address"))
    tag = ""
    amount = Decimal(10)
    withdraw_order_id = None
    stage = WithdrawalStage.SUCCEEDED
    funded = True
    age = None
    tx_id = None
    confirmations = None
    info = None

    @classmethod
    def _create(cls, model_class, *args, account, coin, network, stage, funded, age, **fields) -> Withdrawal:
        net = NetworkFactory(coin__code=coin, network=network)
        amount = _amount(fields.pop("amount"))
        shown = {name: fields.pop(name) for name in ("tx_id", "confirmations", "info")}
        after = {name: value for name, value in shown.items() if value is not None}
        WhitelistAddress.objects.get_or_create(
            account=account,
            network=net,
            address=fields["address"],
            tag=fields["tag"],
            defaults={"name": f"{coin} {network}"},
        )
        if funded:
            fund(account, net.coin, amount + net.withdraw_fee)
        withdrawal = wallet_withdrawals.withdrawal_apply(
            account=account, coin=coin, network=network, amount=amount, **fields
        )
        if stage == WithdrawalStage.SUCCEEDED:
            # An amount above the approval threshold waits for an operator; its approval holds the same funds.
            Withdrawal.objects.filter(pk=withdrawal.pk, stage=WithdrawalStage.AWAITING_APPROVAL).update(
                stage=WithdrawalStage.QUEUED
            )
            withdrawal = wallet_settlement.withdrawal_process(withdrawal_id=withdrawal.pk)
        elif stage == WithdrawalStage.FAILED:
            # Failed and released as a rejection is, without a staff member (decided_by stays empty,
            # no audit row): the rejection's own rules are tested through wallet.approvals.
            withdrawal = wallet_settlement.fail_and_release(
                withdrawal,
                info=after.pop("info", "rejected by operations"),
                from_stages=(WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED),
            )
        elif stage != withdrawal.stage:
            Withdrawal.objects.filter(pk=withdrawal.pk).update(stage=stage)  # the same hold: no money moves
        withdrawal.refresh_from_db()
        # QUEUED is handed to the worker on commit: where the test's transactions commit, the (eager)
        # worker has taken it further already, as production's would.
        assert withdrawal.stage == stage or stage == WithdrawalStage.QUEUED, (withdrawal.stage, withdrawal.info)
        if after:
            Withdrawal.objects.filter(pk=withdrawal.pk).update(**after)
            withdrawal.refresh_from_db()
        return _age(Withdrawal, withdrawal, "applied_at", age)


class TransferFactory(factory.Factory):
    """A transfer made by wallet.transfers.services.transfer_create from `sender` to `recipient`'s
    e-mail (`target_address` to send elsewhere); `funded=True` funds amount plus fee first."""

    class Meta:
        model = Transfer

    sender = factory.SubFactory(UserFactory)
    recipient = factory.SubFactory(UserFactory)
    asset = "USDT"
    amount = Decimal(1)
    target_address = factory.LazyAttribute(lambda row: row.recipient.email)
    message = ""
    client_transfer_id = None
    api_version = "v4"
    funded = True

    @classmethod
    def _create(cls, model_class, *args, sender, recipient, asset, funded, **fields) -> Transfer:
        code = AssetFactory(code=asset).code
        amount = _amount(fields.pop("amount"))
        if funded:
            fee = TransferFee.objects.filter(asset__code=code).values_list("fee", flat=True).first() or Decimal(0)
            fund(sender, code, amount + fee)
        return transfer_services.transfer_create(sender=sender, asset_code=code, amount=amount, **fields)


def convert_markets() -> None:
    """The demo world's convert markets, pairs, prices and house liquidity (convert.demo.load, funded
    from equity through the ledger) on factory-made BTC, ETH, USDT and PHP; no accounts."""
    for code in convert_demo.PRECISION:
        AssetFactory(code=code)
    convert_demo.load()


class QuoteFactory(factory.Factory):
    """A quote made by convert.services.quote_create (the markets must exist: `convert_markets()`;
    tests that quote repeatedly set CONVERT_QUOTE_INTERVAL_MS to 0)."""

    class Meta:
        model = Quote

    user = factory.SubFactory(UserFactory)
    source = "BTC"
    target = "PHP"
    source_amount = Decimal("0.01")
    target_amount = None

    @classmethod
    def _create(cls, model_class, *args, user, source, target, source_amount, target_amount) -> Quote:
        return convert_services.quote_create(
            user=user,
            source_code=source,
            target_code=target,
            source_amount=None if source_amount is None else _amount(source_amount),
            target_amount=None if target_amount is None else _amount(target_amount),
        )


class OrderFactory(QuoteFactory):
    """The order of a quote accepted by convert.services.quote_accept. `outcome`: "accept" (the
    default; `funded=True` funds the source amount first), "expire" (the quote expired before the
    accept: a failed order) or "insufficient" (accepted without the funds: a failed order).
    `created_at` dates the order."""

    class Meta:
        model = Order

    outcome = "accept"
    funded = True
    created_at = None

    @classmethod
    def _create(cls, model_class, *args, outcome, funded, created_at, **fields) -> Order:
        quote = super()._create(Quote, **fields)
        if outcome == "expire":
            Quote.objects.filter(pk=quote.pk).update(expires_at=quote.created_at)
        elif outcome == "accept" and funded:
            fund(fields["user"], quote.pair.source, quote.source_amount)
        try:
            convert_services.quote_accept(user=fields["user"], quote_id=quote.quote_id)
        except convert_errors.ConvertError:
            assert outcome != "accept", "the accept was refused"
        else:
            assert outcome == "accept", f"the accept went through ({outcome} expected)"
        if created_at is not None:
            Order.objects.filter(quote=quote).update(created_at=created_at)
        return Order.objects.select_related("pair__source", "pair__target", "quote").get(quote=quote)


def sub_account(master: User, **user) -> User:
    """A sub-account of `master`, made by subaccounts.services.sub_account_create."""
    email = user.pop("email", None) or f"sub{next(_references)}-{time.time_ns()}@test.example"
    return subaccount_services.sub_account_create(master=master, email=email)


class SubAccountTransferFactory(factory.Factory):
    """A universal transfer made by subaccounts.services.universal_transfer inside `master`'s family:
    from `source` to `target` (each the master or one of its sub-accounts; the master by default);
    `funded=True` funds the source first."""

    class Meta:
        model = SubAccountTransfer

    master = factory.SubFactory(UserFactory)
    source = factory.LazyAttribute(lambda row: row.master)
    target = factory.LazyAttribute(lambda row: sub_account(row.master))
    asset = "USDT"
    amount = Decimal(1)
    client_tran_id = None
    funded = True

    @classmethod
    def _create(cls, model_class, *args, master, source, target, asset, amount, client_tran_id, funded):
        code = AssetFactory(code=asset).code
        if funded:
            fund(source, code, amount)
        return subaccount_services.universal_transfer(
            master=master,
            from_email=None if source.pk == master.pk else source.email,
            to_email=None if target.pk == master.pk else target.email,
            asset_code=code,
            amount=_amount(amount),
            client_tran_id=client_tran_id,
        )


class FundCollectionFactory(factory.Factory):
    """A fund collection task made by subaccounts.collection.fund_collection_create; `run=True` runs
    it as the worker does (fund_collection_run), moving the sub-accounts' balances to the master."""

    class Meta:
        model = FundCollection

    master = factory.SubFactory(UserFactory)
    client_request_id = factory.Sequence(lambda n: f"collect-{n}-{time.time_ns()}")
    remark = ""
    run = False

    @classmethod
    def _create(cls, model_class, *args, run, **fields) -> FundCollection:
        collection = collection_services.fund_collection_create(**fields)
        if run:
            collection = collection_services.fund_collection_run(collection_id=collection.pk)
        return collection


def demo_accounts(*, wallet: bool = False) -> dict[str, dict]:
    """The demo world's accounts alone, in the `demo` fixture's shape: its master (e-mail, phone),
    the master's sub-account and an unrelated peer, each with a key ("demo") and the demo's funding
    (accounts.demo.FUNDING, through the ledger), and the master's read-only key; with `wallet=True`
    the demo's networks and the master's whitelist entry on each (as wallet.demo makes them). No
    markets or house liquidity: for tests of several related accounts with known balances that do
    not test the demo world itself."""
    master = UserFactory(**accounts_demo.MASTER)
    users = {
        "master": master,
        "sub": UserFactory(**accounts_demo.SUB, master=master),
        "peer": UserFactory(**accounts_demo.PEER),
    }
    world = {}
    for role, user in users.items():
        api_key, secret = ApiKeyFactory(user=user, name="demo")
        for code, amount in accounts_demo.FUNDING[role].items():
            fund(user, code, amount)
        world[role] = {"email": user.email, "phone": user.phone, "api_key": api_key.key, "secret_key": secret}
    api_key, secret = ApiKeyFactory(user=master, name="demo-readonly", types=[ApiKeyType.READ_ONLY])
    world["readonly"] = {"email": master.email, "api_key": api_key.key, "secret_key": secret}
    for network in demo_networks() if wallet else ():
        WhitelistAddressFactory(account=master, network=network, name=f"demo {network.coin.code} {network.network}")
    return world
