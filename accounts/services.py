"""Writes owned by accounts: users and API keys."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import string
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from accounts.crypto import encrypt_secret
from accounts.models import FUNCTIONAL_KEY_TYPES, ApiKey, ApiKeyStatus, ApiKeyType, User

logger = logging.getLogger(__name__)

_ALPHABET = string.ascii_letters + string.digits


def _random_token(length: int = 64) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def address_is_reserved(email: str) -> bool:
    """Whether `email` is in the virtual sub-accounts' own space (settings.VIRTUAL_SUB_ACCOUNT_DOMAIN
    or a domain under it): only a virtual sub-account has such an address, so that none can ever be
    a real customer's e-mail (issue 25, finding 4)."""
    domain = email.strip().lower().rpartition("@")[2]
    reserved = settings.VIRTUAL_SUB_ACCOUNT_DOMAIN
    return domain == reserved or domain.endswith("." + reserved)


def user_create(
    *,
    email: str,
    phone: str | None = None,
    password: str | None = None,
    master: User | None = None,
    is_virtual: bool = False,
) -> User:
    if master is not None and master.master_id is not None:
        raise ValueError("A sub-account cannot be the master of another account.")
    if address_is_reserved(email) and not (is_virtual and master is not None):
        raise ValueError("This e-mail domain is reserved for virtual sub-accounts.")
    return User.objects.create_user(
        email=email, password=password, phone=phone or None, master=master, is_virtual=is_virtual
    )


def user_set_frozen(*, user: User, frozen: bool, by: User | None = None) -> User:
    """Freeze or unfreeze an account. A frozen account sends no money (accounts/policy.py, checked
    again under the ledger's lock) and every one of its API keys is refused (-2015); the save evicts
    its keyring in every process (apps.py), so the next request already sees it."""
    if user.system_role is not None:
        raise ValueError("The service's own ledger accounts cannot be frozen.")
    if user.is_frozen != frozen:
        user.is_frozen = frozen
        user.save(update_fields=["is_frozen"])
        logger.info("account %s %s by %s", user.pk, "frozen" if frozen else "unfrozen", by.pk if by else "-")
    return user


def normalize_key_types(types: list[str] | None) -> list[str]:
    """No types means every functional type (a key may use all secure endpoints by default);
    'Read only' excludes the functional types."""
    chosen = list(dict.fromkeys(types or []))
    unknown = [t for t in chosen if t not in ApiKeyType.values]
    if unknown:
        raise ValueError(f"Unknown API key type(s): {', '.join(unknown)}")
    if not chosen:
        return [str(t) for t in FUNCTIONAL_KEY_TYPES]
    if ApiKeyType.READ_ONLY in chosen:
        return [str(ApiKeyType.READ_ONLY)]
    return chosen


def normalize_ip_list(entries: list[str] | None) -> list[str]:
    normalized = []
    for entry in entries or []:
        entry = entry.strip()
        if not entry:
            continue
        network = ipaddress.ip_network(entry, strict=False)  # ValueError for rubbish
        normalized.append(str(network.network_address) if network.num_addresses == 1 else str(network))
    return list(dict.fromkeys(normalized))


@dataclass(frozen=True)
class CreatedApiKey:
    api_key: ApiKey
    secret: str  # the only time the secret exists in clear outside a request


def api_key_create(
    *,
    user: User,
    name: str,
    types: list[str] | None = None,
    ip_list: list[str] | None = None,
    ip_restrict: bool | None = None,
) -> CreatedApiKey:
    if user.system_role is not None:
        raise ValueError("The service's own system accounts cannot have API keys.")
    secret = _random_token(64)
    ips = normalize_ip_list(ip_list)
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            user=user,
            name=name[:64],
            key=_random_token(64),
            secret_ciphertext=encrypt_secret(secret),
            types=normalize_key_types(types),
            status=ApiKeyStatus.ENABLE,
            ip_restrict=bool(ips) if ip_restrict is None else ip_restrict,
            ip_list=ips,
        )
    logger.info("API key %s… created for user %s", api_key.key[:8], user.pk)
    return CreatedApiKey(api_key=api_key, secret=secret)


def api_key_set_status(*, api_key: ApiKey, enabled: bool) -> ApiKey:
    api_key.status = ApiKeyStatus.ENABLE if enabled else ApiKeyStatus.NOT_ENABLE
    api_key.save(update_fields=["status", "updated_at"])
    return api_key


def api_key_set_ip_restriction(*, api_key: ApiKey, ip_restrict: bool, ip_list: list[str]) -> ApiKey:
    api_key.ip_restrict = ip_restrict
    api_key.ip_list = normalize_ip_list(ip_list)
    api_key.save(update_fields=["ip_restrict", "ip_list", "updated_at"])
    return api_key
