"""Writes owned by accounts: users and API keys."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import string
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models, transaction
from django.db.models import Q

from accounts.crypto import encrypt_secret
from accounts.models import FUNCTIONAL_KEY_TYPES, ApiKey, ApiKeyStatus, ApiKeyType, Balance, LedgerAccount, User
from accounts.phones import NOT_E164, is_e164, normalise_phone, phone_normalised
from exchange.backoffice import changes as backoffice_changes
from exchange.backoffice.services import require_reason, staff_action, summary

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


PHONE_TAKEN = "Another account has this phone number (numbers are compared without spaces, dashes and brackets)."
EMAIL_TAKEN = "An account with this e-mail already exists."


def phone_clean(phone: str | None, *, exclude_id: int | None = None) -> str | None:
    """`phone` as it is stored: normalised (accounts/phones.py), E.164, and no other account's
    number. Raises ValueError. The database's unique index on the normalised value decides races."""
    number = normalise_phone(phone)
    if number is None:
        return None
    if not is_e164(number):
        raise ValueError(NOT_E164)
    if phone_holder_id(number, exclude_id=exclude_id) is not None:
        raise ValueError(PHONE_TAKEN)
    return number


def phone_holder_id(number: str, *, exclude_id: int | None = None) -> int | None:
    """The account whose number is `number` once normalised, by the unique index's expression."""
    holders = User.objects.alias(number=phone_normalised()).filter(number=normalise_phone(number))
    if exclude_id is not None:
        holders = holders.exclude(pk=exclude_id)
    return holders.values_list("pk", flat=True).first()


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
        phone=phone_clean(phone),
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


# --- staff changes of accounts (the admin's user pages call these) --------------------------------

# What makes a user staff, superuser or gives them permissions: only superusers set these.
PRIVILEGE_FIELDS = ("is_staff", "is_superuser", "groups", "user_permissions")
FOUR_EYES_ALONE = (
    "Change the fields that wait for a second Administrator (e-mail, phone, master, virtual, limit tier, "
    "withdrawal whitelist) on their own, then the other fields."
)


def may_edit_user(editor: User, target: User) -> bool:
    """Whether `editor` may change `target`'s record (its e-mail, password, status...). A superuser
    may change anyone; anyone else only customers' records and their own: another staff member's
    record (its password or e-mail above all) would be a way into that member's permissions, and
    a superuser's into everything."""
    if editor.is_superuser:
        return True
    if target.system_role is not None:  # the service's own ledger accounts: never an operator's to change
        return False
    return target.pk == editor.pk or not (target.is_staff or target.is_superuser)


def email_clean(email: str, *, exclude_id: int | None = None, keep: str | None = None) -> str:
    """`email` as it is stored (lower case) when it may be an account's address: a valid e-mail, not
    another account's, and not in the virtual sub-accounts' space unless it is `keep` (the account's
    own address, unchanged). Raises ValueError."""
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValueError("Enter a valid e-mail address.") from None
    if User.objects.filter(email=email).exclude(pk=exclude_id).exists():
        raise ValueError(EMAIL_TAKEN)
    if address_is_reserved(email) and email != (keep or "").lower():
        raise ValueError("This e-mail domain is reserved for virtual sub-accounts.")
    return email


def _require_staff(actor: User, permission: str) -> None:
    if not (actor.is_active and actor.is_staff and actor.has_perm(permission)):
        raise StaffChangeRefused("You may not change accounts.")


def user_change_by_staff(*, actor: User, user: User, changes: dict, reason: str | None):
    """A staff member's change of an account's fields (`changes`: {field: new value}, the fields
    that changed), with a reason; returns exchange.backoffice.changes.ChangeOutcome.

    The fields that decide where money addressed to someone lands or who owns an account's money
    (e-mail, phone, master, virtual, limit tier, and the withdrawal whitelist switched off:
    accounts/controls.py) are never applied by one person: they go through
    exchange.backoffice.changes.change_submit, which proposes them for a second Administrator
    (audited as account.propose, applied by account.approve), and they change on their own, not
    beside other fields. Any other field is applied at once, audited as account.change. Refused
    (StaffChangeRefused, ChangeRefused, ReasonRequired) for someone who may not change `user`, for
    privilege fields unless a superuser asks, and for an e-mail or phone another account has."""
    reason = require_reason(reason)
    _require_staff(actor, "accounts.change_user")
    stored = User.objects.get(pk=user.pk)  # as it is, not as a form may have changed the object in memory
    if not may_edit_user(actor, stored):
        raise StaffChangeRefused("Staff and house accounts are not yours to change.")
    if not actor.is_superuser and set(changes) & set(PRIVILEGE_FIELDS):
        raise StaffChangeRefused("Only a superuser changes staff status, groups and permissions.")
    values = dict(changes)
    try:
        if "email" in values:
            values["email"] = email_clean(values["email"], exclude_id=stored.pk, keep=stored.email)
        if "phone" in values:
            values["phone"] = phone_clean(values["phone"], exclude_id=stored.pk)
    except ValueError as exc:
        raise StaffChangeRefused(str(exc)) from exc
    four_eyes = {name: value for name, value in values.items() if name in backoffice_changes.guarded(User).fields}
    if four_eyes:
        if len(four_eyes) != len(values):
            raise StaffChangeRefused(FOUR_EYES_ALONE)
        return backoffice_changes.change_submit(actor=actor, obj=stored, changes=four_eyes, reason=reason)
    fields = tuple(name for name in values if name not in ("groups", "user_permissions", "password"))
    with transaction.atomic():
        current = User.objects.select_for_update().get(pk=stored.pk)
        with staff_action(actor=actor, action="account.change", reason=reason, target=current, fields=fields) as draft:
            for name in fields:
                value = values[name]
                setattr(
                    current, User._meta.get_field(name).attname, value.pk if isinstance(value, models.Model) else value
                )
            if fields:
                current.save(update_fields=[User._meta.get_field(name).attname for name in fields])
            draft.after = {**summary(current, fields), "changed": sorted(changes)}
    return backoffice_changes.ChangeOutcome(applied=True, changed=dict(values), obj=current)


def user_create_by_staff(
    *, actor: User, email: str, phone: str | None, password: str | None, master: User | None, reason: str | None
):
    """An account made in the back office, with a reason (audited as account.create); returns the
    account and, when `master` is given, the proposal that makes it `master`'s sub-account. The
    account is always created as a master of its own: a sub-account is its master's money (the
    master moves it), so putting an account under someone's master waits for a second
    Administrator like any change of master (exchange.backoffice.changes; proposed here, audited as
    account.propose). Refused (StaffChangeRefused, ReasonRequired) without the permission or for an
    e-mail or phone another account has."""
    reason = require_reason(reason)
    _require_staff(actor, "accounts.add_user")
    try:
        email = email_clean(email)
        number = phone_clean(phone)
    except ValueError as exc:
        raise StaffChangeRefused(str(exc)) from exc
    with transaction.atomic():  # a master refused (accounts.controls) undoes the creation too
        with staff_action(actor=actor, action="account.create", reason=reason) as draft:
            user = user_create(email=email, phone=number, password=password)
            draft.target = user
            draft.after = {**summary(user, ("email", "phone", "master")), "master_asked": master.pk if master else None}
        proposal = None
        if master is not None:
            proposal = backoffice_changes.change_submit(
                actor=actor, obj=user, changes={"master": master.pk}, reason=reason
            )
    return user, proposal


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
