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
from decimal import Decimal

import factory
from factory.django import DjangoModelFactory

from accounts import demo as accounts_demo
from accounts import ledger
from accounts import services as account_services
from accounts.ledger.services import funding_post
from accounts.models import ApiKey, Asset, SystemRole, User
from tests.support.client import SignedClient
from wallet import demo as wallet_demo
from wallet.models import Network, WhitelistAddress

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
