from __future__ import annotations

import re

from django.db.models import Q

from accounts.models import User
from exchange.api import formatting as fmt
from wallet.models import Transfer

_ID = re.compile(r"[0-9]{1,18}")


def _address(user: User) -> str:
    return user.email


def transfer_json(transfer: Transfer, *, viewer: User) -> dict:
    """A transfer record as the caller sees it (type 1 received, 2 sent)."""
    places = transfer.asset.transfer_precision
    source = _address(transfer.sender)
    return {
        "id": str(transfer.pk),
        "client_transfer_id": transfer.client_transfer_id or "",
        "account": transfer.asset.code,
        "amount": fmt.amount(transfer.amount, places),
        "fee_amount": fmt.amount(transfer.fee, places),
        "currency": transfer.asset.code,
        "payment": str(transfer.posting_id),
        "status": transfer.status,
        "message": transfer.message,
        "target_address": transfer.target_address,
        "sourceAddress": source,
        "source_address": source,
        "type": 2 if transfer.sender_id == viewer.pk else 1,
        "created_at": transfer.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def created_json(transfer: Transfer) -> dict:
    """The `transfer` object answered by POST v4/v3 transfers."""
    places = transfer.asset.transfer_precision
    return {
        "id": str(transfer.pk),
        "status": transfer.status,
        "account": transfer.asset.code,
        "target_address": transfer.target_address,
        "amount": fmt.amount(transfer.amount, places),
        "fee_amount": fmt.amount(transfer.fee, places),
        "exchange": None,
        "payment": str(transfer.posting_id),
        "client_transfer_id": transfer.client_transfer_id or "",
        "message": transfer.message,
        "errorMessage": None,
    }


def _visible(user: User):
    return Transfer.objects.select_related("asset", "sender").filter(Q(sender=user) | Q(recipient=user))


def transfer_get(
    *, user: User, transfer_id: str | None = None, client_transfer_id: str | None = None
) -> Transfer | None:
    transfers = _visible(user)
    if transfer_id is not None:
        return transfers.filter(pk=int(transfer_id)).first() if _ID.fullmatch(transfer_id) else None
    return transfers.filter(sender=user, client_transfer_id=client_transfer_id).first()


def transfer_list(
    *,
    user: User,
    page: int,
    per_page: int,
    client_transfer_id: str | None = None,
    from_user: User | None = None,
    to_user: User | None = None,
) -> dict:
    transfers = _visible(user)
    if client_transfer_id is not None:
        transfers = transfers.filter(client_transfer_id=client_transfer_id)
    if from_user is not None:
        transfers = transfers.filter(sender=from_user)
    if to_user is not None:
        transfers = transfers.filter(recipient=to_user)
    total = transfers.count()
    offset = (page - 1) * per_page
    items = [transfer_json(t, viewer=user) for t in transfers.order_by("id")[offset : offset + per_page]]
    return {
        "transfers": items,
        "meta": {
            "total_count": total,
            "next_page": page + 1 if offset + per_page < total else None,
            "previous_page": page - 1 if page > 1 else None,
        },
    }
