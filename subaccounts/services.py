"""Sub-account writes: creating virtual sub-accounts, and moving money inside a family (a master
and its sub-accounts).

A transfer is one VIRTUAL_DISTRIBUTE posting (the spec's business type for a master's virtual
sub-accounts; it counts against no limit, the family's money stays in the family) from the source
to the target account, with the SubAccountTransfer row written in the posting's own statement.
The row's clientTranId is unique per master: a repeat, even a concurrent twin, fails at that
constraint (or at the posting's reference) and moves nothing. The source is the posting's sender,
so a frozen sub-account (or master) cannot send, as its ledger row says under the lock.

A transfer the source's balance does not cover is recorded as a failed transfer (no posting) and
answered with `result: false`; its clientTranId is then spent. Every other refusal is an error and
records nothing.
"""

from __future__ import annotations

import logging
import uuid
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import ledger, policy
from accounts import services as account_services
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.models import Asset, BusinessType
from accounts.models import ApiKey, User
from accounts.selectors import asset_by_code
from exchange.runtime.amounts import decimal_places
from subaccounts import addresses, errors, selectors
from subaccounts.models import SubAccountTransfer, TransferKind, TransferStatus
from wallet.errors import InvalidAmount

logger = logging.getLogger(__name__)

TRANSFER_KIND = BusinessType.VIRTUAL_DISTRIBUTE
MAX_VIRTUAL_SUB_ACCOUNTS = 30  # per master (spec)


def require_master(account: User) -> None:
    if account.master_id is not None:
        raise errors.MasterOnly()


def require_sub_account(account: User) -> None:
    if account.master_id is None:
        raise errors.SubAccountOnly()


def sub_account_of(*, master: User, email: str) -> User:
    """`master`'s sub-account with this e-mail (any case): its own address, or the e-mail a virtual
    one was named with (`requested_email`); looked up inside the family only, so any other account
    is not found (-1151), whoever has that e-mail (selectors.sub_account_named)."""
    sub = selectors.sub_account_named(master_id=master.pk, email=email)
    if sub is None:
        raise errors.SubAccountNotFound(email)
    return sub


def sub_account_create(*, master: User, email: str) -> User:
    """A virtual sub-account of `master` named `email`. The master sees and calls it by that e-mail
    (kept as sent in `requested_email`, unique per master); its own address is the name moved into
    the master's part of the reserved domain (subaccounts/addresses.py), so it never takes a real
    customer's e-mail, never blocks a registration, and a name can only be taken inside the family
    (a sub-account of the master's already named so or with that address). It has no usable
    password, so it cannot log in anywhere; it is reached through its master (and through its own
    API keys, which operators create in the admin). At most MAX_VIRTUAL_SUB_ACCOUNTS per master,
    counted under the master's row lock so that concurrent creations cannot pass the limit together."""
    require_master(master)
    address = addresses.virtual_address(master_id=master.pk, account_name=email)
    name = email.strip()
    limit = MAX_VIRTUAL_SUB_ACCOUNTS
    try:
        with transaction.atomic():
            User.objects.select_for_update().filter(pk=master.pk).values_list("pk", flat=True).get()
            if User.objects.filter(master_id=master.pk, is_virtual=True).count() >= limit:
                raise errors.TooManySubAccounts(limit)
            taken = User.objects.filter(email=address).exists()  # only ever one of this master's own
            if taken or selectors.sub_account_named(master_id=master.pk, email=name) is not None:
                raise errors.AccountNameTaken()
            sub = account_services.user_create(email=address, master=master, is_virtual=True, requested_email=name)
    except IntegrityError as exc:  # the same name created concurrently
        raise errors.AccountNameTaken() from exc
    logger.info("Virtual sub-account %s created for master %s", sub.pk, master.pk)
    return sub


def _check_amount(asset: Asset, amount: Decimal) -> None:
    if amount <= 0:
        raise InvalidAmount("must be positive")
    if decimal_places(amount) > asset.transfer_precision:  # counted exactly, not after normalize()'s rounding
        raise InvalidAmount(f"at most {asset.transfer_precision} decimal places")


def _transfer(
    *,
    master: User,
    source: User,
    target: User,
    asset: Asset,
    amount: Decimal,
    client_tran_id: str | None,
    kind: TransferKind,
) -> SubAccountTransfer:
    if source.pk == target.pk:
        raise errors.SameAccount()
    _check_amount(asset, amount)
    policy.require_may_send(source)  # again under the ledger's lock (senders)
    if not policy.may_receive(target):
        raise errors.TargetMayNotReceive()
    client_tran_id = client_tran_id or uuid.uuid4().hex
    values = {
        "master_id": master.pk,
        "from_account_id": source.pk,
        "to_account_id": target.pk,
        "asset_id": asset.pk,
        "amount": amount,
        "client_tran_id": client_tran_id,
        "kind": kind.value,
        "status": TransferStatus.SUCCESS.value,
    }
    try:
        result = ledger.post(
            senders=(source.pk,),
            legs=ledger.move(source.pk, target.pk, asset.code, amount),
            kind=TRANSFER_KIND,
            reference=f"subaccount-transfer:{master.pk}:{client_tran_id}",
            memo=f"{kind.value} {client_tran_id}"[:255],
            row=ledger.LinkedRow(SubAccountTransfer, values),
        )
    except IntegrityError as exc:
        raise errors.DuplicateClientTranId() from exc
    except InsufficientBalance:
        return _record_failure(values)
    stored = {"id": result.row_id, "posting_id": result.posting_id, "created_at": result.created_at, **values}
    return _instance(stored)


def _instance(stored: dict) -> SubAccountTransfer:
    fields = SubAccountTransfer._meta.concrete_fields
    return SubAccountTransfer.from_db("default", [f.attname for f in fields], [stored.get(f.attname) for f in fields])


def _record_failure(values: dict) -> SubAccountTransfer:
    """A transfer the balance did not cover: kept as failed (no posting); its clientTranId is spent.
    If a concurrent twin took the id first, the repeat is refused like any other."""
    try:
        with transaction.atomic():
            row = SubAccountTransfer.objects.create(
                **{**values, "status": TransferStatus.FAILED.value}, created_at=timezone.now()
            )
    except IntegrityError as exc:
        raise errors.DuplicateClientTranId() from exc
    return row


def universal_transfer(
    *,
    master: User,
    from_email: str | None,
    to_email: str | None,
    asset_code: str,
    amount: Decimal,
    client_tran_id: str | None = None,
) -> SubAccountTransfer:
    """Master to sub-account, sub-account to master or between two sub-accounts of `master`; an
    omitted e-mail is the master itself."""
    require_master(master)
    if from_email is None and to_email is None:
        raise errors.EmailRequired()
    asset = asset_by_code(asset_code)
    if asset is None:
        raise errors.NoSuchAsset("asset")
    _check_amount(asset, amount)  # every parameter before any look-up (issue 25, finding 7)
    source = sub_account_of(master=master, email=from_email) if from_email is not None else master
    target = sub_account_of(master=master, email=to_email) if to_email is not None else master
    return _transfer(
        master=master,
        source=source,
        target=target,
        asset=asset,
        amount=amount,
        client_tran_id=client_tran_id,
        kind=TransferKind.UNIVERSAL,
    )


def sub_to_master(
    *, sub: User, asset_code: str, amount: Decimal, client_tran_id: str | None = None
) -> SubAccountTransfer:
    """A sub-account sends to its own master (with the sub-account's key)."""
    require_sub_account(sub)
    asset = asset_by_code(asset_code)
    if asset is None:
        raise errors.NoSuchAsset("asset")
    master = User.objects.get(pk=sub.master_id)
    return _transfer(
        master=master,
        source=sub,
        target=master,
        asset=asset,
        amount=amount,
        client_tran_id=client_tran_id,
        kind=TransferKind.SUB_TO_MASTER,
    )


# --- API-key IP restrictions of a sub-account's key (issue 15, item 7) ----------------------------
#
# The master manages the IP list of one of its sub-account's keys. Every change goes through
# accounts.services.api_key_set_ip_restriction, whose save evicts the sub-account's keyring in
# this process at once and in every process on commit (accounts/keyring.py), so the gateway
# applies the new list (-2017 from elsewhere) from the very next request. Add and delete lock the
# key's row first, so concurrent batches on one key are applied one after the other and none is
# lost.

MAX_IP_ADDRESSES = 30  # per key: a list longer than that is refused (-1025)
IP_RESTRICTED = "1"  # ipRestriction: trusted IPs only
IP_UNRESTRICTED = "2"  # ipRestriction: any address


def ip_batch_parse(text: str | None) -> list[str]:
    """The addresses of a comma-separated batch (IPv4, IPv6, or a CIDR network of either), in
    their canonical text, in order, without repeats; blank entries are skipped. The first entry
    that is not an address is refused (-1025) and names it."""
    entries = [entry.strip() for entry in (text or "").split(",")]
    for entry in entries:
        if not entry:
            continue
        try:
            account_services.normalize_ip_list([entry])
        except ValueError as exc:
            raise errors.InvalidIpAddress(f"'{entry[:64]}' is not an IPv4 or IPv6 address or network") from exc
    return account_services.normalize_ip_list(entries)


def sub_account_api_key_get(*, master: User, email: str, apikey: str, lock: bool = False) -> ApiKey:
    """The key `apikey` of `master`'s sub-account `email` (-1151 for any other e-mail, and for a
    key that is not that sub-account's); with `lock`, its row locked until the transaction ends."""
    sub = sub_account_of(master=master, email=email)
    keys = ApiKey.objects.select_for_update() if lock else ApiKey.objects
    api_key = keys.filter(user_id=sub.pk, key=apikey).first()
    if api_key is None:
        raise errors.SubAccountKeyNotFound(email)
    return api_key


def sub_account_ip_restriction_add(
    *, master: User, email: str, apikey: str, ip_addresses: str | None, restrict: bool
) -> ApiKey:
    """Merge `ip_addresses` (a comma-separated batch) into the key's list (kept in order, without
    repeats) and set whether only the list may use the key. Refused, changing nothing (-1025): a
    bad address, a list of more than MAX_IP_ADDRESSES, or trusted IPs only with an empty list (a
    key nobody could use: the gateway would answer -1023)."""
    require_master(master)
    batch = ip_batch_parse(ip_addresses)
    with transaction.atomic():
        api_key = sub_account_api_key_get(master=master, email=email, apikey=apikey, lock=True)
        current = list(api_key.ip_list)
        merged = account_services.normalize_ip_list([*current, *batch])
        if len(merged) > MAX_IP_ADDRESSES:
            raise errors.InvalidIpAddress(f"a key's list holds at most {MAX_IP_ADDRESSES} addresses")
        if restrict and not merged:
            raise errors.InvalidIpAddress("trusted IPs only (ipRestriction=1) needs at least one address")
        if merged == current and restrict == api_key.ip_restrict:
            return api_key  # nothing to change (updateTime stays)
        api_key = account_services.api_key_set_ip_restriction(api_key=api_key, ip_restrict=restrict, ip_list=merged)
    logger.info("IP list of key %s… of sub-account %s set by master %s", apikey[:8], api_key.user_id, master.pk)
    return api_key


def sub_account_ip_restriction_delete(*, master: User, email: str, apikey: str, ip_addresses: str) -> ApiKey:
    """Remove the batch's addresses from the key's list (compared in canonical form; one not in the
    list is skipped). `ipRestrict` is left as it is: a restricted key whose list becomes empty is
    refused everywhere (-1023) until addresses are added or the restriction is lifted."""
    require_master(master)
    batch = ip_batch_parse(ip_addresses)
    if not batch:
        raise errors.InvalidIpAddress("send at least one address")
    removed = set(batch)
    with transaction.atomic():
        api_key = sub_account_api_key_get(master=master, email=email, apikey=apikey, lock=True)
        current = list(api_key.ip_list)
        remaining = [ip for ip in account_services.normalize_ip_list(current) if ip not in removed]
        if remaining == current:
            return api_key
        api_key = account_services.api_key_set_ip_restriction(
            api_key=api_key, ip_restrict=api_key.ip_restrict, ip_list=remaining
        )
    logger.info("IP list of key %s… of sub-account %s cut by master %s", apikey[:8], api_key.user_id, master.pk)
    return api_key
