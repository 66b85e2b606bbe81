"""Load the demo world (idempotent): a master with a sub-account, an unrelated peer, and a
read-only key of the master; the assets BTC, ETH, USDT and PHP; every demo account funded once
through the ledger (from the equity account); the networks BTC (BTC), ETH (ETH), USDT (ETH, TRX); a
withdrawal whitelist entry of the master per crypto coin and network. `--json` prints the keys
for scripts and the README's examples.

Demo keys are the one place a secret is shown again (the demo must be re-runnable); the command
refuses to run under production settings.
"""

import json
import os
from decimal import Decimal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import services
from accounts.crypto import decrypt_secret
from accounts.ledger.services import funding_post
from accounts.models import ApiKey, ApiKeyType, Asset, User

DEMO_PASSWORD = "demo-password-change-me"  # noqa: S105 - demo accounts only
MASTER = {"email": "master@demo.exchange", "phone": "+639170000001"}
SUB = {"email": "sub1@demo.exchange", "phone": None}
PEER = {"email": "peer@demo.exchange", "phone": "+639170000002"}
ASSETS = [
    # code, name, transfer precision, minimum transfer, fiat, reference price in PHP (for limits)
    ("BTC", "Bitcoin", 8, "0.00001", False, "5000000"),
    ("ETH", "Ethereum", 8, "0.0001", False, "200000"),
    ("USDT", "Tether USD", 6, "0.01", False, "58"),
    ("PHP", "Philippine peso", 2, "1", True, "1"),
]
FUNDING = {
    "master": {"BTC": "10", "ETH": "100", "USDT": "100000", "PHP": "1000000"},
    "sub": {"BTC": "1", "ETH": "10", "USDT": "1000", "PHP": "10000"},
    "peer": {"BTC": "0.5", "ETH": "5", "USDT": "500", "PHP": "5000"},
}


def _assets() -> None:
    for code, name, precision, minimum, fiat, price in ASSETS:
        Asset.objects.get_or_create(
            code=code,
            defaults={
                "name": name,
                "transfer_precision": precision,
                "transfer_min_quantity": Decimal(minimum),
                "is_fiat": fiat,
                "reference_price": Decimal(price),
            },
        )


NETWORKS = [
    # coin, network, name, address regex, min confirmations, fee, min, multiple
    ("BTC", "BTC", "Bitcoin", r"^(bc1|[13])[a-zA-HJ-NP-Z0-9]{25,62}$", 2, "0.0005", "0.001", "0.00000001"),
    ("ETH", "ETH", "Ethereum (ERC20)", r"^(0x)[0-9A-Fa-f]{40}$", 6, "0.005", "0.01", "0.00000001"),
    ("USDT", "ETH", "Ethereum (ERC20)", r"^(0x)[0-9A-Fa-f]{40}$", 6, "5", "10", "0.000001"),
    ("USDT", "TRX", "Tron (TRC20)", r"^T[1-9A-HJ-NP-Za-km-z]{33}$", 3, "1", "10", "0.000001"),
]
WHITELIST = {
    "BTC": "bc1qdemo0master0whitelist0address0000000",
    "ETH": "0x00000000000000000000000000000000000d3e40",
    "TRX": "TDemoMasterWhitezistAddress1111111",
}


def _networks() -> None:
    from wallet.models import Network

    for coin, network, name, regex, confirmations, fee, minimum, multiple in NETWORKS:
        Network.objects.get_or_create(
            coin=Asset.objects.get(code=coin),
            network=network,
            defaults={
                "name": name,
                "address_regex": regex,
                "min_confirm": confirmations,
                "withdraw_fee": Decimal(fee),
                "withdraw_min": Decimal(minimum),
                "withdraw_integer_multiple": Decimal(multiple),
                "withdraw_max": Decimal("1000000"),
            },
        )


def _whitelist(user: User) -> None:
    from wallet.models import Network, WhitelistAddress

    for network in Network.objects.select_related("coin"):
        WhitelistAddress.objects.get_or_create(
            account=user,
            network=network,
            address=WHITELIST[network.network],
            tag="",
            defaults={"name": f"demo {network.coin.code} {network.network}"},
        )


def _fund(role: str, user: User) -> None:
    for code, amount in FUNDING[role].items():
        funding_post(account=user, asset_code=code, amount=Decimal(amount), reference=f"demo:fund:{user.email}:{code}")


def _user(email: str, phone: str | None, master: User | None = None) -> User:
    user = User.objects.filter(email=email).first()
    if user is None:
        user = services.user_create(email=email, phone=phone, password=DEMO_PASSWORD, master=master)
    return user


def _key(user: User, name: str, types: list[str] | None = None) -> tuple[str, str]:
    api_key = ApiKey.objects.filter(user=user, name=name).first()
    if api_key is None:
        created = services.api_key_create(user=user, name=name, types=types)
        return created.api_key.key, created.secret
    return api_key.key, decrypt_secret(api_key.secret_ciphertext)


class Command(BaseCommand):
    help = "Create the demo accounts and keys (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print the demo accounts and keys as JSON.")

    def handle(self, *args, **options):
        if (settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE", "")).endswith("production"):
            raise CommandError("The demo world is not for production.")
        with transaction.atomic():
            master = _user(**MASTER)
            sub = _user(**SUB, master=master)
            peer = _user(**PEER)
            master_key = _key(master, "demo")
            sub_key = _key(sub, "demo")
            peer_key = _key(peer, "demo")
            readonly_key = _key(master, "demo-readonly", [ApiKeyType.READ_ONLY])
            _assets()
            _networks()
            _whitelist(master)
            for role, user in (("master", master), ("sub", sub), ("peer", peer)):
                _fund(role, user)
        world = {
            "master": {
                "email": master.email,
                "phone": master.phone,
                "api_key": master_key[0],
                "secret_key": master_key[1],
            },
            "sub": {"email": sub.email, "api_key": sub_key[0], "secret_key": sub_key[1]},
            "peer": {"email": peer.email, "phone": peer.phone, "api_key": peer_key[0], "secret_key": peer_key[1]},
            "readonly": {"email": master.email, "api_key": readonly_key[0], "secret_key": readonly_key[1]},
        }
        if options["json"]:
            self.stdout.write(json.dumps(world))
        else:
            for role, entry in world.items():
                self.stdout.write(f"{role}: {entry['email']} api_key={entry['api_key']}")
            self.stdout.write("Run with --json to see the secrets.")
