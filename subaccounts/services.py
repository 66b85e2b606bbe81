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

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import ledger, policy
from accounts import services as account_services
from accounts.ledger.models import Asset, BusinessType
from accounts.models import User
from exchange.api.errors import InsufficientBalance
from exchange.ttlcache import TtlCache
from subaccounts import errors
from subaccounts.models import SubAccountTransfer, TransferKind, TransferStatus

logger = logging.getLogger(__name__)

TRANSFER_KIND = BusinessType.VIRTUAL_DISTRIBUTE
MAX_VIRTUAL_SUB_ACCOUNTS = 30  # per master (spec)

_assets = TtlCache(10.0)


def asset_by_code(code: str) -> Asset | None:
    return _assets.get(code, lambda: Asset.objects.filter(code=code).first())


def require_master(account: User) -> None:
    if account.master_id is not None:
        raise errors.MasterOnly()


def require_sub_account(account: User) -> None:
    if account.master_id is None:
        raise errors.SubAccountOnly()


def sub_account_of(*, master: User, email: str) -> User:
    """`master`'s sub-account with this e-mail (any case); any other account is not found (-1151)."""
    sub = User.objects.filter(master_id=master.pk, email=email.strip().lower()).first()
    if sub is None:
        raise errors.SubAccountNotFound(email)
    return sub


def sub_account_create(*, master: User, email: str) -> User:
    """A virtual sub-account of `master` with e-mail `email`. It has no usable password, so it
    cannot log in anywhere; it is reached through its master (and through its own API keys, which
    operators create in the admin). At most MAX_VIRTUAL_SUB_ACCOUNTS per master, counted under the
    master's row lock so that concurrent creations cannot pass the limit together."""
    require_master(master)
    email = email.strip()
    try:
        validate_email(email)
    except ValidationError as exc:
        raise errors.InvalidAccountName("not an e-mail address") from exc
    email = email.lower()
    limit = MAX_VIRTUAL_SUB_ACCOUNTS
    try:
        with transaction.atomic():
            User.objects.select_for_update().filter(pk=master.pk).values_list("pk", flat=True).get()
            if User.objects.filter(master_id=master.pk, is_virtual=True).count() >= limit:
                raise errors.TooManySubAccounts(limit)
            if User.objects.filter(email=email).exists():
                raise errors.AccountNameTaken()
            sub = account_services.user_create(email=email, master=master, is_virtual=True)
    except IntegrityError as exc:  # the same e-mail created concurrently
        raise errors.AccountNameTaken() from exc
    logger.info("Virtual sub-account %s created for master %s", sub.pk, master.pk)
    return sub


def _check_amount(asset: Asset, amount: Decimal) -> None:
    if amount <= 0:
        raise errors.InvalidAmount("must be positive")
    exponent = amount.normalize().as_tuple().exponent
    if isinstance(exponent, int) and exponent < -asset.transfer_precision:
        raise errors.InvalidAmount(f"at most {asset.transfer_precision} decimal places")


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
        raise errors.UnknownAsset("asset")
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
        raise errors.UnknownAsset("asset")
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
