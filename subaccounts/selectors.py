"""Sub-account reads: a master's sub-accounts, a sub-account's balances, the family's transfers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from accounts.models import User
from accounts.selectors import AssetBalance, balance_rows
from exchange.api.errors import EndTimeBeforeStartTime, PeriodTooLong
from exchange.api.timewindow import from_ms, shift
from exchange.runtime import replicas
from subaccounts import addresses
from subaccounts.models import FundCollection, SubAccountTransfer

HISTORY_SPAN = timedelta(days=30)


@dataclass(frozen=True)
class SubAccountPage:
    sub_accounts: list[User]
    total: int


def sub_account_named(*, master_id: int, email: str) -> User | None:
    """The sub-account of `master_id` an `email` parameter names (any case), looked up inside the
    family only: the one whose own e-mail (a real sub-account's, or a virtual one's address in the
    reserved space) it is, else the virtual one named with it (`requested_email`, or for one named
    before the name was kept, the name's address). One query; None when no sub-account has it, also
    when an account outside the family has that e-mail."""
    email = email.strip()
    if not email:
        return None
    candidates = addresses.lookup_addresses(master_id=master_id, email=email)
    rows = list(
        User.objects.filter(master_id=master_id).filter(Q(email__in=candidates) | Q(requested_email__iexact=email))
    )

    def rank(user: User) -> int:
        if user.email == candidates[0]:
            return 0
        return 1 if user.requested_email.lower() == email.lower() else 2

    return min(rows, key=lambda user: (rank(user), user.pk), default=None)


def sub_account_list(*, master: User, email: str | None, page: int, limit: int) -> SubAccountPage:
    """`master`'s sub-accounts (virtual or not), oldest first; `email` (any case; the e-mail a
    virtual one was named with, or its address) narrows to one."""
    if email is not None:
        found = sub_account_named(master_id=master.pk, email=email)
        found_list = [found] if found is not None else []
        skip = (page - 1) * limit
        return SubAccountPage(found_list[skip : skip + limit], len(found_list))
    rows = User.objects.filter(master_id=master.pk).order_by("id")
    total = rows.count()
    skip = (page - 1) * limit
    return SubAccountPage(list(rows[skip : skip + limit]) if skip < total else [], total)


def sub_account_balances(*, sub: User) -> list[AssetBalance]:
    return balance_rows(user=sub)


def history_period(
    start_ms: int | None, end_ms: int | None, *, now: datetime | None = None
) -> tuple[datetime, datetime]:
    """[start, end) of a transfer history: endTime is excluded. Without either, the last 30 days;
    with one, the 30 days after startTime or before endTime; with both, at most 30 days apart."""
    now = now or timezone.now()
    start = from_ms(start_ms, "startTime") if start_ms is not None else None
    end = from_ms(end_ms, "endTime") if end_ms is not None else None
    if start is None and end is None:
        end = now
    if start is None:
        start = shift(end, -HISTORY_SPAN, "endTime")
    if end is None:
        end = shift(start, HISTORY_SPAN, "startTime")
    if end < start:
        raise EndTimeBeforeStartTime()
    if end - start > HISTORY_SPAN:
        raise PeriodTooLong(HISTORY_SPAN.days)
    return start, end


@dataclass(frozen=True)
class TransferPage:
    transfers: list[SubAccountTransfer]
    total: int


def _family(master_id: int):
    """The master and its sub-accounts: a transfer between two sub-accounts posts on neither the
    master's account nor the caller's, yet the master's history lists it. Read on the primary (a
    sub-account just created), and only when a replica is configured (history_alias asks)."""
    yield master_id
    yield from User.objects.using(replicas.PRIMARY).filter(master_id=master_id).values_list("pk", flat=True)


def _page(rows, *, page: int, limit: int) -> TransferPage:
    total = rows.count()
    skip = (page - 1) * limit
    found = (
        list(
            rows.select_related("from_account", "to_account", "asset").order_by("created_at", "id")[skip : skip + limit]
        )
        if skip < total
        else []
    )
    return TransferPage(found, total)


def universal_transfer_history(
    *,
    master: User,
    from_account: User | None,
    to_account: User | None,
    client_tran_id: str | None,
    asset_code: str | None,
    start: datetime,
    end: datetime,
    page: int,
    limit: int,
) -> TransferPage:
    """The family's transfers (universal and sub-to-master) from `from_account` (or to
    `to_account`), oldest first, in [start, end). May come from the replica unless anyone of the
    family posted lately (exchange/runtime/replicas.py); a look-up by clientTranId reads the primary."""

    def read(alias: str) -> TransferPage:
        return _universal_page(
            alias, master, from_account, to_account, client_tran_id, asset_code, start, end, page, limit
        )

    if client_tran_id is not None:
        return read(replicas.PRIMARY)
    return replicas.history_read(read, account_ids=_family(master.pk))


def _universal_page(
    alias, master, from_account, to_account, client_tran_id, asset_code, start, end, page, limit
) -> TransferPage:
    rows = SubAccountTransfer.objects.using(alias).filter(
        master_id=master.pk, created_at__gte=start, created_at__lt=end
    )
    if from_account is not None:
        rows = rows.filter(from_account_id=from_account.pk)
    if to_account is not None:
        rows = rows.filter(to_account_id=to_account.pk)
    if client_tran_id is not None:
        rows = rows.filter(client_tran_id=client_tran_id)
    if asset_code is not None:
        rows = rows.filter(asset__code=asset_code)
    return _page(rows, page=page, limit=limit)


TRANSFERS_IN = 1
TRANSFERS_OUT = 2


def sub_transfer_history(
    *,
    sub: User,
    direction: int,
    asset_code: str | None,
    client_tran_id: str | None,
    start: datetime,
    end: datetime,
    page: int,
    limit: int,
) -> TransferPage:
    """The sub-account's transfers in its family: received (TRANSFERS_IN) or sent (TRANSFERS_OUT).
    May come from the replica unless the sub-account posted lately (every transfer it is a side of
    posts on it); a look-up by clientTranId reads the primary."""

    def read(alias: str) -> TransferPage:
        return _sub_page(alias, sub, direction, asset_code, client_tran_id, start, end, page, limit)

    if client_tran_id is not None:
        return read(replicas.PRIMARY)
    return replicas.history_read(read, account_ids=[sub.pk])


def _sub_page(alias, sub, direction, asset_code, client_tran_id, start, end, page, limit) -> TransferPage:
    side = Q(to_account_id=sub.pk) if direction == TRANSFERS_IN else Q(from_account_id=sub.pk)
    rows = SubAccountTransfer.objects.using(alias).filter(
        side, master_id=sub.master_id, created_at__gte=start, created_at__lt=end
    )
    if asset_code is not None:
        rows = rows.filter(asset__code=asset_code)
    if client_tran_id is not None:
        rows = rows.filter(client_tran_id=client_tran_id)
    return _page(rows, page=page, limit=limit)


# --- fund collection ---------------------------------------------------------------------------------


def fund_collection_list(*, master: User, client_request_id: str | None, page: int, size: int) -> list[FundCollection]:
    """`master`'s collection tasks, oldest first; `client_request_id` narrows to one. Always on the
    primary: the collect call writes its task without a posting, so the replicas' sticky rule would
    not see it (docs/scaling.md)."""
    rows = FundCollection.objects.filter(master_id=master.pk).order_by("id")
    if client_request_id is not None:
        rows = rows.filter(client_request_id=client_request_id)
    skip = (page - 1) * size
    return list(rows[skip : skip + size])
