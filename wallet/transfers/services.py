"""Transfers between accounts (v4 and legacy v3): one P2P_TRANSFER posting moves the amount from
the sender to the recipient and the fee to the sender's shard of the fees account; the client's
transfer id is unique per sender (a database constraint), so a repeat moves nothing."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import NoReturn

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import ledger, limits, policy
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.models import Asset, Balance, BusinessType, Entry, LedgerAccount, Posting
from accounts.models import SystemRole, User
from accounts.phones import is_e164, normalise_phone
from accounts.selectors import UserRef, asset_by_code, transfer_parties
from exchange.backoffice.services import require_reason, staff_action, summary
from exchange.runtime.ttlcache import ReferenceCache
from wallet import errors
from wallet.approvals import approval_value_of
from wallet.models import Transfer, TransferFee
from wallet.withdrawals import fits_precision

logger = logging.getLogger(__name__)


# A recipient's phone number is E.164 (`+` and 7 to 15 digits) once normalised as stored numbers
# are (accounts/phones.py: spaces, dashes and brackets ignored): a number sent as `%2B63...` and
# resent raw as `+63...` (the `+` read as a space) must not find another account (docs/security.md, M2).

# Read by every transfer: cached per process; a change of a fee reaches every process within
# REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py; TransferFee's signals in wallet/apps.py).
transfer_fees = ReferenceCache("transfer fees")


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


@dataclass(frozen=True)
class _Request:
    """What a transfer request asked, as sent: what a repeat of its client_transfer_id is compared with."""

    asset: Asset
    target_address: str
    amount: Decimal
    client_transfer_id: str | None


def _duplicate(sender: User, request: _Request) -> errors.DuplicateClientTransferId:
    """The refusal of a client_transfer_id the sender has used (-1010), naming the transfer that used
    it, and saying whether this request is that one again (the same asset, amount and address text:
    an honest client's retry after a lost answer) or another one. It compares the request with the
    sender's own transfer only, never looks the address up: the answer is the same whoever the
    address belongs to (issue 34, finding 7)."""
    found = (
        Transfer.objects.filter(sender_id=sender.pk, client_transfer_id=request.client_transfer_id)
        .values_list("id", "asset_id", "amount", "target_address")
        .first()
    )
    if found is None:
        return errors.DuplicateClientTransferId()
    transfer_id, asset_id, amount, target_address = found
    same = (asset_id, amount, target_address) == (request.asset.pk, request.amount, request.target_address)
    return errors.DuplicateClientTransferId.of(transfer_id, same_request=same)


def _refuse_unreachable(sender: User, request: _Request, total: Decimal) -> NoReturn:
    """Refuse a transfer to an address no transfer may reach with the answer a reachable address
    would get for the same request, in the ledger's order: the sender's limit (-1010, the posting's
    guard), its balance (-1131, the debit), a client_transfer_id already used (-1010 Duplicate, the
    posting's unique reference), and only then -1151. Otherwise an amount over the sender's balance
    or limit, or a reused client_transfer_id (issue 34, finding 7), would probe which addresses are
    registered for free. Only this refusal path reads the balance; a transfer that goes ahead is
    checked by the posting."""
    asset = request.asset
    refused = limits.outflow_refusal(sender, asset, total, withdrawal=False)
    if refused:
        raise errors.LimitExceeded(*refused)
    free = Balance.objects.filter(account_id=sender.pk, asset_id=asset.pk).values_list("free", flat=True).first()
    if (free or Decimal(0)) < total:
        raise InsufficientBalance()
    if request.client_transfer_id is not None:
        # Under the sender's ledger lock, the one every posting takes first: a transfer of this
        # sender in flight with the same id commits (and is seen) before this answers, just as a
        # reachable address's posting would wait for it and fail on the unique reference.
        with transaction.atomic():
            list(LedgerAccount.objects.select_for_update().filter(user_id=sender.pk).values_list("user_id"))
            used = Transfer.objects.filter(sender_id=sender.pk, client_transfer_id=request.client_transfer_id).exists()
        if used:
            raise _duplicate(sender, request)
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
    request = _Request(asset, target_address, amount, client_transfer_id)
    if "@" not in target_address and not is_e164(normalise_phone(target_address.strip())):
        _refuse_unreachable(sender, request, amount + fee)
    # One statement: the recipient, and the sender's limit counters with its ledger seq (the limit
    # check runs on them now, and again under the lock only if it refused or the seq has moved).
    recipient, snap = transfer_parties(sender_id=sender.pk, address=target_address)
    if not _reachable(recipient, sender):
        _refuse_unreachable(sender, request, amount + fee)
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
            raise _duplicate(sender, request) from exc
        raise
    # The row as the posting's statement stored it (the columns it did not write are NULL), loaded
    # without a query.
    stored = {"id": result.row_id, "posting_id": result.posting_id, "created_at": result.created_at, **values}
    fields = Transfer._meta.concrete_fields
    transfer = Transfer.from_db("default", [f.attname for f in fields], [stored.get(f.attname) for f in fields])
    transfer.asset = asset  # rendered by the caller; no query
    return transfer


class ReversalRefused(ValueError):
    """A reversal refused as asked: already reversed, by someone who may not, or the four-eyes rule
    (the Administrator who asked for it confirming it)."""


REVERSE_PERMISSION = "wallet.change_transfer"  # Administrators (exchange/backoffice/roles.py)
REVERSAL_FIELDS = (
    "sender",
    "recipient",
    "asset",
    "amount",
    "fee",
    "posting",
    "reversal_requested_by",
    "reversal_requested_at",
    "reversal_reason",
    "reversed_by",
    "reversal_posting",
)


def reversal_needs_two(transfer: Transfer) -> bool:
    """Whether reversing `transfer` takes two Administrators: its amount plus fee, in PHP at the
    asset's reference price now (as a withdrawal's four-eyes value), is above
    TRANSFER_REVERSAL_FOUR_EYES_ABOVE (0 by default: every reversal), or the asset has no price."""
    coin = Asset.objects.get(pk=transfer.asset_id)  # today's price, not a cached row's
    value = approval_value_of(coin, transfer.amount + transfer.fee)
    return value is None or value > settings.TRANSFER_REVERSAL_FOUR_EYES_ABOVE


def _require_may_reverse(actor: User) -> None:
    if not (actor.is_active and actor.is_staff and actor.has_perm(REVERSE_PERMISSION)):
        raise ReversalRefused("Only an Administrator may reverse a transfer.")


def _locked_for_reversal(transfer_id: int) -> Transfer:
    """The transfer, locked for the decision (concurrent requests and confirmations queue here and
    the later ones see the earlier); refused once reversed. Must run inside a transaction."""
    locked = Transfer.objects.select_for_update().get(pk=transfer_id)
    if locked.reversal_posting_id is not None:
        raise ReversalRefused(f"Transfer #{locked.pk} was already reversed.")
    return locked


def transfer_reverse(*, transfer: Transfer, reversed_by: User, reason: str | None) -> Transfer:
    """Operators undo a transfer with a new posting (the original stays in the journal): the amount
    goes back from the recipient and the fee from the fees shard that received it. Once only.

    A reversal takes money out of a customer's account, so it follows the adjustments' four eyes
    (issue 34, finding 2): when `reversal_needs_two`, the first Administrator's call only records
    the request (reversal_requested_by; no money moves) and a second Administrator's call posts it;
    the one who asked confirming is refused (ReversalRefused), and so is anyone without the
    permission, a missing reason (ReasonRequired) or a transfer already reversed. The audit row
    (transfer.reverse_request, transfer.reverse) is written here, in the same transaction. A debit
    beyond what the recipient holds is refused (InsufficientBalance) and leaves the request open.
    The reversal's posting is of business type OTHERS: the customers' history and stream show it
    as a correction, not as a transfer either of them made."""
    reason = require_reason(reason)
    _require_may_reverse(reversed_by)
    with transaction.atomic():
        locked = _locked_for_reversal(transfer.pk)
        before = summary(locked, REVERSAL_FIELDS)
        if locked.reversal_requested_by_id is None and reversal_needs_two(locked):
            with staff_action(
                actor=reversed_by, action="transfer.reverse_request", reason=reason, target=locked, before=before
            ) as draft:
                Transfer.objects.filter(pk=locked.pk).update(
                    reversal_requested_by=reversed_by,
                    reversal_requested_at=timezone.now(),
                    reversal_reason=reason[:255],
                )
                locked.refresh_from_db()
                draft.after = summary(locked, REVERSAL_FIELDS)
            transfer.refresh_from_db()
            return transfer  # waits for a second Administrator
        if locked.reversal_requested_by_id == reversed_by.pk:
            raise ReversalRefused(
                f"You asked for the reversal of transfer #{locked.pk}: another Administrator must confirm it."
            )
        with staff_action(
            actor=reversed_by, action="transfer.reverse", reason=reason, target=locked, before=before
        ) as draft:
            done = _reverse_posting(locked, reversed_by, reason)
            draft.after = summary(done, REVERSAL_FIELDS)
    transfer.refresh_from_db()
    return transfer


def transfer_reversal_cancel(*, transfer: Transfer, cancelled_by: User, reason: str | None) -> Transfer:
    """Drop an open reversal request (its author or another Administrator); nothing was posted.
    Audited (transfer.reverse_cancel)."""
    reason = require_reason(reason)
    _require_may_reverse(cancelled_by)
    with transaction.atomic():
        locked = _locked_for_reversal(transfer.pk)
        if locked.reversal_requested_by_id is None:
            raise ReversalRefused(f"Transfer #{locked.pk} has no reversal request to cancel.")
        with staff_action(
            actor=cancelled_by,
            action="transfer.reverse_cancel",
            reason=reason,
            target=locked,
            fields=REVERSAL_FIELDS,
        ) as draft:
            Transfer.objects.filter(pk=locked.pk).update(
                reversal_requested_by=None, reversal_requested_at=None, reversal_reason=""
            )
            locked.refresh_from_db()
            draft.after = summary(locked, REVERSAL_FIELDS)
    transfer.refresh_from_db()
    return transfer


def _reverse_posting(transfer: Transfer, reversed_by: User, reason: str) -> Transfer:
    asked_by = transfer.reversal_requested_by
    memo = (
        f"reversal asked by {asked_by.email}: {transfer.reversal_reason}; confirmed by {reversed_by.email}: {reason}"
        if asked_by is not None
        else f"reversal by {reversed_by.email}: {reason}"
    )
    recorded_reason = transfer.reversal_reason if asked_by is not None else reason
    code = Asset.objects.filter(pk=transfer.asset_id).values_list("code", flat=True).get()
    legs = ledger.move(transfer.recipient_id, transfer.sender_id, code, transfer.amount)
    if transfer.fee <= 0:
        return _post_reversal(transfer, legs, reversed_by, memo, recorded_reason)
    credited = _fee_shard(transfer)
    refund = ledger.move(credited, transfer.sender_id, code, transfer.fee)
    try:
        return _post_reversal(transfer, legs + refund, reversed_by, memo, recorded_reason)
    except InsufficientBalance:
        payers = _fee_payers(transfer, credited)
        if payers is None:  # the recipient's side, or the fees accounts as a whole, is short
            raise
    logger.warning("Fee refund of transfer %s: fees shard %s is short, paid by %s", transfer.pk, credited, payers)
    for shard, part in payers:
        legs += ledger.move(shard, transfer.sender_id, code, part)
    return _post_reversal(transfer, legs, reversed_by, memo, recorded_reason)


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


def _post_reversal(transfer: Transfer, legs, reversed_by: User, memo: str, reason: str) -> Transfer:
    with transaction.atomic():  # a savepoint: a refused attempt leaves the caller's transaction usable
        result = ledger.post(
            legs=legs,
            kind=BusinessType.OTHERS,
            reference=f"transfer-reversal:{transfer.pk}",
            memo=memo[:255],
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
