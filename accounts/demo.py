"""The accounts part of the demo world (idempotent): a master with a sub-account, an unrelated peer,
and a read-only key of the master; the assets BTC, ETH, USDT and PHP; every demo account funded once
through the ledger (from the equity account).

Run by the `demo` command (settings.DEMO_LOADERS); other apps load their own part after this one
and may read the constants below (e.g. MASTER to find the master account).
"""

from __future__ import annotations

import logging
from decimal import Decimal

from accounts import services
from accounts.crypto import decrypt_secret
from accounts.ledger.services import funding_post
from accounts.models import ApiKey, ApiKeyType, Asset, User

logger = logging.getLogger(__name__)

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
# `demo --customers K` (the simulation's world, harness/simulation): K more customers, each a master
# with one virtual sub-account, their own keys and this funding; wallet.demo whitelists their withdrawals.
CUSTOMER_EMAIL = "customer{n}@sim.demo.exchange"
CUSTOMER_SUB_EMAIL = "customer{n}.sub@sim.demo.exchange"
CUSTOMER_FUNDING = {
    "master": {"BTC": "2", "ETH": "50", "USDT": "50000", "PHP": "500000"},
    "sub": {"BTC": "0.2", "ETH": "5", "USDT": "5000", "PHP": "50000"},
}
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


def _fund(role: str, user: User, funding: dict[str, dict[str, str]] = FUNDING) -> None:
    for code, amount in funding[role].items():
        funding_post(account=user, asset_code=code, amount=Decimal(amount), reference=f"demo:fund:{user.email}:{code}")


def _user(email: str, phone: str | None, master: User | None = None) -> User:
    user = User.objects.filter(email=email).first()
    if user is None:
        if phone is not None and services.phone_holder_id(phone) is not None:
            # Numbers are unique (accounts/phones.py): the account that has it keeps it.
            logger.warning("demo: %s is created without its phone number, which another account has", email)
            phone = None
        user = services.user_create(email=email, phone=phone, password=DEMO_PASSWORD, master=master)
    return user


def _key(user: User, name: str, types: list[str] | None = None) -> tuple[str, str]:
    api_key = ApiKey.objects.filter(user=user, name=name).first()
    if api_key is None:
        created = services.api_key_create(user=user, name=name, types=types)
        return created.api_key.key, created.secret
    return api_key.key, decrypt_secret(api_key.secret_ciphertext)


def customer_emails(count: int) -> list[str]:
    return [CUSTOMER_EMAIL.format(n=n) for n in range(1, count + 1)]


def _customers(count: int) -> list[dict]:
    found = []
    for n in range(1, count + 1):
        master = _user(CUSTOMER_EMAIL.format(n=n), None)
        sub = _user(CUSTOMER_SUB_EMAIL.format(n=n), None, master=master)
        entry = {}
        for role, user in (("master", master), ("sub", sub)):
            _fund(role, user, CUSTOMER_FUNDING)
            key, secret = _key(user, "simulation")
            entry[role] = {"email": user.email, "api_key": key, "secret_key": secret}
        found.append(entry)
    return found


def load(customers: int = 0) -> dict[str, dict]:
    """Users, keys, assets and funding; returns the demo accounts and their keys by role (and, with
    `customers`, the simulation's customers under "customers")."""
    master = _user(**MASTER)
    sub = _user(**SUB, master=master)
    peer = _user(**PEER)
    master_key = _key(master, "demo")
    sub_key = _key(sub, "demo")
    peer_key = _key(peer, "demo")
    readonly_key = _key(master, "demo-readonly", [ApiKeyType.READ_ONLY])
    _assets()
    for role, user in (("master", master), ("sub", sub), ("peer", peer)):
        _fund(role, user)
    world = {"customers": _customers(customers)} if customers else {}
    return world | {
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
