"""Writes owned by accounts: users and API keys."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import string
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from accounts.crypto import encrypt_secret
from accounts.models import FUNCTIONAL_KEY_TYPES, ApiKey, ApiKeyStatus, ApiKeyType, Balance, LedgerAccount, User

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
    requested_email: str = "",
) -> User:
    """`requested_email`: for a virtual sub-account, the e-mail its master named it with (shown and
    looked up only inside its family; subaccounts.services.sub_account_create)."""
    if master is not None and master.master_id is not None:
        raise ValueError("A sub-account cannot be the master of another account.")
    if address_is_reserved(email) and not (is_virtual and master is not None):
        raise ValueError("This e-mail domain is reserved for virtual sub-accounts.")
    if requested_email and not (is_virtual and master is not None):
        raise ValueError("Only a virtual sub-account has a requested e-mail.")
    return User.objects.create_user(
        email=email,
        password=password,
        phone=phone or None,
        master=master,
        is_virtual=is_virtual,
        requested_email=requested_email,
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


class StaffChangeRefused(ValueError):
    """A staff change of an account or a key that the rules below refuse (docs/security.md)."""


REPARENT_NOT_EMPTY = "{user} still holds {what}: an account is moved to another master only when it holds nothing."


def user_reparent_check(*, user: User, master_id: int | None) -> None:
    """Whether `user` may be given the master `master_id` (None: made a master of its own). A
    master may move every sub-account's money (universal transfers, fund collection), so an account
    that holds anything never changes master: it is emptied first, by its owner. Called when the
    change is proposed and again when it is approved, under the account's ledger lock (the row every
    posting of the account locks first), so nothing arrives between the check and the change."""
    if user.system_role is not None:
        raise StaffChangeRefused("The service's own ledger accounts have no master.")
    if master_id is not None:
        master = User.objects.filter(pk=master_id).first()
        if master is None or master.pk == user.pk:
            raise StaffChangeRefused("An account cannot be its own master.")
        if master.master_id is not None:
            raise StaffChangeRefused("A sub-account cannot be the master of another account.")
        if master.system_role is not None or master.is_staff:
            raise StaffChangeRefused("Only a customer account can be a master.")
        if user.sub_accounts.exists():
            raise StaffChangeRefused(f"{user} has sub-accounts of its own: a master cannot become a sub-account.")
    LedgerAccount.objects.select_for_update().filter(user_id=user.pk).first()
    held = [
        f"{(free + locked).normalize():f} {code}"
        for code, free, locked in Balance.objects.filter(account_id=user.pk)
        .filter(Q(free__gt=0) | Q(locked__gt=0))
        .values_list("asset__code", "free", "locked")
    ]
    if held:
        raise StaffChangeRefused(REPARENT_NOT_EMPTY.format(user=user, what=", ".join(held)))


def user_set_master(*, user: User, master_id: int | None) -> User:
    """Re-parent `user` (after user_reparent_check, in its transaction: exchange/backoffice/changes.py)."""
    user.master_id = master_id
    user.save(update_fields=["master"])
    logger.info("account %s now has master %s", user.pk, master_id or "-")
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


STAFF_KEY_READ_ONLY = (
    "Staff issue read-only keys only: a key that trades, converts or moves funds is the customer's "
    "own credential and is never made or seen by staff."
)
STAFF_KEY_NO_WIDENING = (
    "Staff may only narrow a key's types (or disable it): giving a key more types would make a "
    "credential act for the customer in ways its owner did not ask for."
)


def _functional(types: list[str]) -> set[str]:
    return {str(t) for t in normalize_key_types(types) if t in FUNCTIONAL_KEY_TYPES}


def staff_may_set_key_types(*, old: list[str], new: list[str]) -> bool:
    """Staff may take functional types away from a key, never add one."""
    return _functional(new) <= _functional(old)


def api_key_issue_by_staff(
    *, user: User, name: str, types: list[str] | None, ip_list: list[str] | None, ip_restrict: bool | None
) -> CreatedApiKey:
    """A key made in the back office. Its secret is shown once to the staff member who made it, to
    hand to the customer, so it is always Read only: it reads what staff see anyway and acts for the
    customer in nothing (-1020 on every write). `types` naming a functional type is refused
    (StaffChangeRefused), never silently narrowed: the person asked for something else."""
    if types is not None and _functional(types):
        raise StaffChangeRefused(STAFF_KEY_READ_ONLY)
    return api_key_create(user=user, name=name, types=[ApiKeyType.READ_ONLY], ip_list=ip_list, ip_restrict=ip_restrict)


def api_key_change_by_staff(
    *, api_key: ApiKey, name: str, types: list[str], enabled: bool, ip_restrict: bool, ip_list: list[str]
) -> ApiKey:
    """A staff change of a key: its name, IP list and status, and its types only to fewer
    functional types than it has (a customer's full key may be narrowed; none is widened)."""
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        if not staff_may_set_key_types(old=locked.types, new=types):
            raise StaffChangeRefused(STAFF_KEY_NO_WIDENING)
        locked.name = name[:64]
        locked.types = normalize_key_types(types)
        locked.save(update_fields=["name", "types", "updated_at"])
        api_key_set_ip_restriction(api_key=locked, ip_restrict=ip_restrict, ip_list=ip_list)
        return api_key_set_status(api_key=locked, enabled=enabled)


def api_key_set_status(*, api_key: ApiKey, enabled: bool) -> ApiKey:
    api_key.status = ApiKeyStatus.ENABLE if enabled else ApiKeyStatus.NOT_ENABLE
    api_key.save(update_fields=["status", "updated_at"])
    return api_key


def api_key_set_ip_restriction(*, api_key: ApiKey, ip_restrict: bool, ip_list: list[str]) -> ApiKey:
    api_key.ip_restrict = ip_restrict
    api_key.ip_list = normalize_ip_list(ip_list)
    api_key.save(update_fields=["ip_restrict", "ip_list", "updated_at"])
    return api_key
