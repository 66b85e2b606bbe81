"""Transfers as the spec renders them: snake_case fields (plus the spec's one `sourceAddress`),
amounts as decimal strings with the asset's transfer precision, `created_at` in ISO 8601 UTC with
milliseconds. The selectors return models; only the API layer calls these."""

from __future__ import annotations

from datetime import datetime

from accounts.models import User
from exchange.api import formatting as fmt
from wallet.models import Transfer
from wallet.transfers.selectors import TransferPage


def _iso_millis(moment: datetime) -> str:
    """The spec's form, e.g. 2026-11-22T08:00:00.000Z (the time is UTC, as the database gives it)."""
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def transfer_json(transfer: Transfer, *, viewer: User) -> dict:
    """A transfer record as `viewer` sees it (type 1 received, 2 sent)."""
    places = transfer.asset.transfer_precision
    source = transfer.sender.email
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
        "created_at": _iso_millis(transfer.created_at),
        **_reversal_fields(transfer),
    }


def _reversal_fields(transfer: Transfer) -> dict:
    """A reversed transfer says so (issue 34, finding 2): the reversal's posting id, which is the
    `txId` of its OTHERS row in the transaction history, and when it was posted. Absent otherwise;
    `status` stays the spec's `success` (the transfer itself happened)."""
    reversal = transfer.reversal_posting
    if reversal is None:
        return {}
    return {"reversed": True, "reversal_payment": str(reversal.pk), "reversed_at": _iso_millis(reversal.created_at)}


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


def transfer_list_json(page: TransferPage, *, viewer: User) -> dict:
    return {
        "transfers": [transfer_json(t, viewer=viewer) for t in page.transfers],
        "meta": {
            "total_count": page.total_count,
            "next_page": page.next_page,
            "previous_page": page.previous_page,
        },
    }
