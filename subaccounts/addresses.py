"""The virtual sub-accounts' own address space (issue 25, finding 4; docs/subaccounts.md,
"Addresses of virtual sub-accounts").

A master names a virtual sub-account with an e-mail (`accountName`, as the spec and the official
clients send it); the sub-account's address is that name moved into the master's own part of the
reserved domain:

    fresh.one@test.example, created by master 12  ->  fresh.one_test.example@m12.virtual.invalid

- It can never be a real customer's e-mail: nobody may register an address in the reserved domain
  (accounts.services.address_is_reserved, in user_create and the admin), and the name's own e-mail
  is left free for whoever owns it.
- It is scoped per master (`m<master id>`): a name can only collide with the master's own
  sub-accounts, so creating tells the master nothing about who is registered elsewhere.
- The name is kept whole and can be read back (a DNS domain has no `_`, so the last `_` splits it),
  and the master may keep using the name: every sub-account endpoint finds the sub-account by its
  address or by the name it was created with (subaccounts.services.sub_account_of).
- Only `_`, `.` and the name's own characters: the address survives a query string sent as typed
  (Postman), where `+` would be read as a space.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from accounts.services import address_is_reserved
from subaccounts import errors

EMAIL_LENGTH = 254  # the e-mail column's


def master_domain(master_id: int) -> str:
    return f"m{master_id}.{settings.VIRTUAL_SUB_ACCOUNT_DOMAIN}"


def virtual_address(*, master_id: int, account_name: str) -> str:
    """The address of `master_id`'s virtual sub-account named `account_name` (an e-mail, any case);
    -1025 (InvalidAccountName) for a name that is not an e-mail, is in the reserved space, or makes
    an address that is not one (a quoted local part, an address literal) or is too long."""
    name = account_name.strip()
    try:
        validate_email(name)
    except ValidationError as exc:
        raise errors.InvalidAccountName("not an e-mail address") from exc
    name = name.lower()
    if address_is_reserved(name):
        raise errors.InvalidAccountName("that domain is reserved for virtual sub-accounts; send an e-mail of your own")
    local, _, domain = name.rpartition("@")
    address = f"{local}_{domain}@{master_domain(master_id)}"
    if len(address) > EMAIL_LENGTH:
        raise errors.InvalidAccountName("too long for a sub-account's address")
    try:
        validate_email(address)
    except ValidationError as exc:
        raise errors.InvalidAccountName("not usable as a sub-account's name") from exc
    return address


def lookup_addresses(*, master_id: int, email: str) -> list[str]:
    """The addresses a master's `email` parameter may name one of its sub-accounts by: the address
    itself and, for a name a virtual sub-account was created with, that sub-account's address."""
    email = email.strip().lower()
    try:
        return [email, virtual_address(master_id=master_id, account_name=email)]
    except errors.InvalidAccountName:
        return [email]
