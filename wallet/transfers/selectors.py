"""Reads of transfers: model instances (with their asset and sender), for the API
(wallet/transfers/presenters.py renders them as the spec says), the admin and other apps."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Q

from accounts.models import User
from exchange.runtime import replicas
from wallet.models import Transfer

_ID = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True, slots=True)
class TransferPage:
    """One page of transfers, oldest first, and where the others are (page numbers from 1)."""

    transfers: Sequence[Transfer]
    total_count: int
    next_page: int | None
    previous_page: int | None


NO_TRANSFERS = TransferPage(transfers=(), total_count=0, next_page=None, previous_page=None)


def _visible(user: User, alias: str = replicas.PRIMARY):
    return (
        Transfer.objects.using(alias)
        .select_related("asset", "sender", "reversal_posting")
        .filter(Q(sender=user) | Q(recipient=user))
    )


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
) -> TransferPage:
    """The transfers `user` sent or received (optionally only those with `client_transfer_id`, from
    `from_user` or to `to_user`), page `page` of `per_page`. The list may come from the replica
    (exchange/runtime/replicas.py); a look-up by `client_transfer_id` reads the primary: it is how a
    client finds out whether a transfer it got no answer for was made."""

    def read(alias: str) -> TransferPage:
        return _transfer_page(alias, user, page, per_page, client_transfer_id, from_user, to_user)

    if client_transfer_id is not None:
        return read(replicas.PRIMARY)
    return replicas.history_read(read, account_ids=[user.pk])


def _transfer_page(alias, user, page, per_page, client_transfer_id, from_user, to_user) -> TransferPage:
    transfers = _visible(user, alias)
    if client_transfer_id is not None:
        transfers = transfers.filter(client_transfer_id=client_transfer_id)
    if from_user is not None:
        transfers = transfers.filter(sender=from_user)
    if to_user is not None:
        transfers = transfers.filter(recipient=to_user)
    total = transfers.count()
    offset = (page - 1) * per_page
    return TransferPage(
        transfers=list(transfers.order_by("id")[offset : offset + per_page]),
        total_count=total,
        next_page=page + 1 if offset + per_page < total else None,
        previous_page=page - 1 if page > 1 else None,
    )
