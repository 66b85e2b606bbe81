"""Transfers between accounts (v4 and legacy v3): one P2P_TRANSFER posting moves the amount from
the sender to the recipient and the fee to the sender's shard of the fees account; the client's
transfer id is unique per sender (a database constraint), so a repeat moves nothing."""

from __future__ import annotations

import logging
import uuid
from decimal import Decimal
from typing import NoReturn

from django.db import IntegrityError, transaction

from accounts import ledger, limits, policy
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.models import Asset, Balance, BusinessType, Entry, Posting
from accounts.models import SystemRole, User
from accounts.phones import is_e164, normalise_phone
from accounts.selectors import UserRef, transfer_parties
from exchange.runtime.ttlcache import TtlCache
from wallet import errors
from wallet.models import Transfer, TransferFee
from wallet.services import fits_precision

logger = logging.getLogger(__name__)


# A recipient's phone number is E.164 (`+` and 7 to 15 digits) once normalised as stored numbers
# are (accounts/phones.py: spaces, dashes and brackets ignored): a number sent as `%2B63...` and
# resent raw as `+63...` (the `+` read as a space) must not find another account (docs/security.md, M2).

assets = TtlCache(10.0)
transfer_fees = TtlCache(10.0)


def asset_by_code(code: str) -> Asset | None:
    return assets.get(code, lambda: Asset.objects.filter(code=code).first())


def _fee_of(asset: Asset) -> Decimal:
    return TransferFee.objects.filter(asset=asset).values_list("fee", flat=True).first() or Decimal(0)


def _reachable(recipient: UserRef | None, sender: User) -> bool:
    """Whether a transfer may reach `recipient`: a customer that may receive and, for a virtual
    sub-account, only from inside its family (its master or a sibling; issue 25, finding 4)."""
    if recipient is None or recipient.system_role is not None or not policy.may_receive(recipient):
        return False
    if recipient.is_virtual and recipient.master_id is not None:
        return sender.pk == recipient.master_id or sender.master_id == recipient.master_id
    return True


def _refuse_unreachable(sender: User, asset: Asset, total: Decimal) -> NoReturn:
    """Refuse a transfer to an address no transfer may reach with the answer a reachable address
    would get for the same request: the sender's limit (-1010) and balance (-1131) refusals come
    first, in the ledger's order (guard, then the debit), and only then -1151. Otherwise an amount
    over the sender's balance or limit would probe which addresses are registered for free. Only
    this refusal path reads the balance; a transfer that goes ahead is checked by the posting."""
    refused = limits.outflow_refusal(sender, asset, total, withdrawal=False)
    if refused:
        raise errors.LimitExceeded(*refused)
    free = Balance.objects.filter(account_id=sender.pk, asset_id=asset.pk).values_list("free", flat=True).first()
    if (free or Decimal(0)) < total:
        raise InsufficientBalance()
    raise errors.RecipientNotFound()


def transfer_create(
    *,
    sender: User,
    asset_code: str,
    target_address: str,
    amount: Decimal,
    message: str = "",
    client_transfer_id: str | None = None,
    api_version: str = "v4",
) -> Transfer:
    asset = asset_by_code(asset_code)
    if asset is None:
        raise errors.UnknownAsset()
    # Every parameter, and everything that depends on the sender alone, is checked before the
    # recipient is looked up: a refusal that came after the look-up (amount=0: "must be positive"
    # for a registered address, -1151 for an unknown one) would tell a caller which addresses are
    # registered without moving anything (issue 25, finding 7).
    if amount <= 0:
        raise errors.InvalidAmount("must be positive")
    if not fits_precision(amount, asset.transfer_precision):
        raise errors.InvalidAmount(f"at most {asset.transfer_precision} decimal places")
    if amount < asset.transfer_min_quantity:
        raise errors.InvalidAmount(f"below the minimum {asset.transfer_min_quantity.normalize():f}")
    policy.require_may_send(sender)
    tier = limits.tier_for(sender)
    policy.require_priced(asset, valuation_currency=tier.currency if tier else None)
    fee = transfer_fees.get(asset.pk, lambda: _fee_of(asset))
    if "@" not in target_address and not is_e164(normalise_phone(target_address.strip())):
        _refuse_unreachable(sender, asset, amount + fee)
    # One statement: the recipient, and the sender's limit counters with its ledger seq (the limit
    # check runs on them now, and again under the lock only if it refused or the seq has moved).
    recipient, snap = transfer_parties(sender_id=sender.pk, address=target_address)
    if not _reachable(recipient, sender):
        _refuse_unreachable(sender, asset, amount + fee)
    if recipient.id == sender.pk:
        raise errors.TransferToSelf()
    legs = ledger.move(sender.pk, recipient.id, asset.code, amount)
    if fee > 0:
        legs += ledger.move(sender.pk, ledger.shard_account_id(SystemRole.FEES, sender.pk), asset.code, fee)

    # Allowed on the snapshot: checked again under the lock only if the sender's seq moved since.
    # Refused on it: decided under the lock instead (counters can go down, e.g. a released
    # withdrawal hold, so a refusal is only final on the state the posting would see).
    checked = limits.outflow_refusal(sender, asset, amount + fee, withdrawal=False, snap=snap) is None

    def guard() -> None:
        # Runs with the sender's (and every other) ledger row locked, unless the snapshot allowed the
        # transfer and the sender's seq has not moved: it then sees every earlier movement of this
        # sender.
        refused = limits.outflow_refusal(sender, asset, amount + fee, withdrawal=False)
        if refused:
            raise errors.LimitExceeded(*refused)

    values = {
        "sender_id": sender.pk,
        "recipient_id": recipient.id,
        "asset_id": asset.pk,
        "amount": amount,
        "fee": fee,
        "target_address": target_address,
        "message": message,
        "client_transfer_id": client_transfer_id,
        "status": "success",
        "api_version": api_version,
        "reversal_reason": "",
    }
    try:
        # The client's id is in the posting's unique reference (and unique per sender on the
        # transfer): a repeat, even a concurrent twin, fails there and moves nothing. The transfer
        # row is written in the posting's own statement.
        result = ledger.post(
            senders=(sender.pk,),  # re-checked under the lock: a freeze committed since stops it
            guard=guard,
            unchanged_since=(sender.pk, snap.seq) if checked and snap.seq is not None else None,
            row=ledger.LinkedRow(Transfer, values),
            legs=legs,
            kind=BusinessType.P2P_TRANSFER,
            reference=f"transfer:{sender.pk}:{client_transfer_id}"
            if client_transfer_id is not None
            else f"transfer-auto:{uuid.uuid4().hex}",
            memo=message[:255],
        )
    except IntegrityError as exc:
        if client_transfer_id is not None:
            raise errors.DuplicateClientTransferId() from exc
        raise
    # The row as the posting's statement stored it (the columns it did not write are NULL), loaded
    # without a query.
    stored = {"id": result.row_id, "posting_id": result.posting_id, "created_at": result.created_at, **values}
    fields = Transfer._meta.concrete_fields
    transfer = Transfer.from_db("default", [f.attname for f in fields], [stored.get(f.attname) for f in fields])
    transfer.asset = asset  # rendered by the caller; no query
    return transfer


def transfer_reverse(*, transfer: Transfer, reversed_by: User, reason: str) -> Transfer:
    """Operators undo a transfer with a new posting (the original stays in the journal): the amount
    goes back from the recipient and the fee from the fees shard that received it. Once only."""
    if not reason.strip():
        raise ValueError("A reversal needs a reason.")
    legs = ledger.move(transfer.recipient_id, transfer.sender_id, transfer.asset.code, transfer.amount)
    if transfer.fee <= 0:
        return _post_reversal(transfer, legs, reversed_by, reason)
    credited = _fee_shard(transfer)
    refund = ledger.move(credited, transfer.sender_id, transfer.asset.code, transfer.fee)
    try:
        return _post_reversal(transfer, legs + refund, reversed_by, reason)
    except InsufficientBalance:
        payers = _fee_payers(transfer, credited)
        if payers is None:  # the recipient's side, or the fees accounts as a whole, is short
            raise
    logger.warning("Fee refund of transfer %s: fees shard %s is short, paid by %s", transfer.pk, credited, payers)
    for shard, part in payers:
        legs += ledger.move(shard, transfer.sender_id, transfer.asset.code, part)
    return _post_reversal(transfer, legs, reversed_by, reason)


def _fee_shard(transfer: Transfer) -> int:
    """The fees account the transfer's posting credited, as its journal says: the sender's shard
    at the time (shard 0 for transfers posted before the fees were sharded), whatever the shard
    count is now."""
    credited = (
        Entry.objects.filter(
            posting_id=transfer.posting_id,
            asset_id=transfer.asset_id,
            side=1,
            account__system_role=SystemRole.FEES,
        )
        .values_list("account_id", flat=True)
        .first()
    )
    return credited if credited is not None else ledger.shard_account_id(SystemRole.FEES, transfer.sender_id)


def _fee_payers(transfer: Transfer, credited: int) -> list[tuple[int, Decimal]] | None:
    """When the credited shard no longer holds the fee (refunds take back only what their own
    transfer brought, so only a move out of a fees account by other means, none in code today, can
    cause that; the shard count changing cannot, as the journal names the shard): what it holds,
    and the rest from the richest other fees shards, in one posting. None when the credited shard
    does hold the fee (the refusal was the recipient's) or the fees accounts together cannot pay."""
    asset = transfer.asset_id
    shards = set(ledger.role_account_ids(SystemRole.FEES)) | {credited}
    free = dict(
        Balance.objects.filter(account_id__in=shards, asset_id=asset, free__gt=0).values_list("account_id", "free")
    )
    if free.get(credited, Decimal(0)) >= transfer.fee:
        return None
    payers, left = [], transfer.fee
    order = [credited, *sorted((s for s in free if s != credited), key=lambda s: (-free[s], s))]
    for shard in order:
        part = min(free.get(shard, Decimal(0)), left)
        if part > 0:
            payers.append((shard, part))
            left -= part
        if left <= 0:
            return payers
    return None


def _post_reversal(transfer: Transfer, legs, reversed_by: User, reason: str) -> Transfer:
    with transaction.atomic():
        result = ledger.post(
            legs=legs,
            kind=BusinessType.P2P_TRANSFER,
            reference=f"transfer-reversal:{transfer.pk}",
            memo=f"reversal by {reversed_by.email}: {reason}"[:255],
            actor_id=reversed_by.pk,
        )
        Transfer.objects.filter(pk=transfer.pk).update(
            reversal_posting=Posting.objects.get(pk=result.posting_id),
            reversed_by=reversed_by,
            reversal_reason=reason[:255],
        )
    transfer.refresh_from_db()
    logger.info("Transfer %s reversed by %s: %s", transfer.pk, reversed_by.email, reason)
    return transfer
