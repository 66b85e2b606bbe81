from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.db import connections
from django.db.models import F, Max, Sum
from django.utils import timezone

from accounts.keyring import KeyRecord, keyrings
from accounts.ledger.posting import fetch_prepared
from accounts.limits import (
    SNAPSHOT_COLUMNS,
    SNAPSHOT_JOINS,
    LimitBlock,
    LimitSnapshot,
    limit_blocks,
    snapshot_from_rows,
    snapshot_join_params,
)
from accounts.models import Asset, Balance, Entry, Posting, User
from accounts.phones import normalise_phone, phone_normalised, phone_normalised_sql
from exchange.runtime import replicas
from exchange.runtime.ttlcache import ReferenceCache

# Read by every transfer (wallet's and the family's) and its key-type check: cached per process; a
# change of an asset reaches every process within REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py;
# Asset's signals in accounts/apps.py, its manager for queryset writes).
_assets = ReferenceCache("assets")


def asset_by_code(code: str) -> Asset | None:
    return _assets.get(code, lambda: Asset.objects.filter(code=code).first())


def api_key_list(*, user: User) -> tuple[KeyRecord, ...]:
    """The user's keys, from the keyring the gateway already holds for this account (same rows,
    same invalidation)."""
    keyring = keyrings.for_user(user.pk)
    return keyring.keys if keyring else ()


def _address_key(address: str) -> tuple[str, str | None]:
    """What a recipient address is found by: an e-mail (any case), or a phone number compared
    normalised (accounts/phones.py: the unique index's expression)."""
    address = address.strip()
    return ("email", address.lower()) if "@" in address else ("phone", normalise_phone(address))


def user_get_by_address(*, address: str) -> User | None:
    """A user by e-mail (case-insensitive) or phone number (normalised)."""
    column, value = _address_key(address)
    if column == "email":
        return User.objects.filter(email=value).first()
    return User.objects.alias(number=phone_normalised()).filter(number=value).first() if value else None


@dataclass(frozen=True)
class UserRef:
    id: int
    system_role: str | None
    is_active: bool
    is_frozen: bool
    master_id: int | None = None
    is_virtual: bool = False


def transfer_parties(*, sender_id: int, address: str) -> tuple[UserRef | None, LimitSnapshot]:
    """The recipient of a transfer (found as user_get_by_address finds the user) and the sender's
    limit snapshot (accounts.limits.LimitSnapshot), in one prepared statement: one round trip."""
    column, value = _address_key(address)
    # E-mails are unique, and so are phone numbers compared normalised: the number is matched by
    # the expression of its unique index (accounts/phones.py), which serves this look-up.
    match = "r.email = %s" if column == "email" else f"{phone_normalised_sql('r.phone')} = %s"
    rows = fetch_prepared(  # the f-string joins this module's constant SQL; values are parameters
        f"SELECT r.id, r.system_role, r.is_active, r.is_frozen, r.master_id, r.is_virtual, {SNAPSHOT_COLUMNS}"  # noqa: S608
        " FROM (SELECT CAST(%s AS bigint) AS id) s"
        f" LEFT JOIN accounts_user r ON {match}"
        f" LEFT JOIN accounts_ledgeraccount la ON la.user_id = s.id{SNAPSHOT_JOINS}",
        [sender_id, value, *snapshot_join_params()],
    )
    first = rows[0]  # the outer query always gives a row
    recipient = (
        UserRef(first[0], first[1], bool(first[2]), bool(first[3]), first[4], bool(first[5]))
        if first[0] is not None
        else None
    )
    return recipient, snapshot_from_rows([row[6:] for row in rows] if first[6] is not None else [])


# --- balances, account information, history ---------------------------------------------------


class AssetBalance(NamedTuple):
    asset: Asset
    free: Decimal
    locked: Decimal


def balance_rows(*, user: User) -> list[AssetBalance]:
    """Every asset (by code) with the account's free and locked (zero where it has none)."""
    held = {b.asset_id: b for b in Balance.objects.filter(account=user)}
    rows = []
    for asset in Asset.objects.order_by("code"):
        balance = held.get(asset.id)
        rows.append(
            AssetBalance(asset, balance.free if balance else Decimal(0), balance.locked if balance else Decimal(0))
        )
    return rows


@dataclass(frozen=True, slots=True)
class AccountInfo:
    user: User
    updated_at: datetime  # the last change of any balance (the account's creation before any)
    balances: list[AssetBalance]
    limits: dict[str, LimitBlock | None]  # by limit period (accounts.limits.limit_blocks)


def account_info(*, user: User) -> AccountInfo:
    blocks = limit_blocks(user)
    last_change = Balance.objects.filter(account=user).aggregate(latest=Max("updated_at"))["latest"]
    return AccountInfo(
        user=user, updated_at=last_change or user.date_joined, balances=balance_rows(user=user), limits=blocks
    )


def crypto_accounts(*, user: User, currency: str | None = None) -> list[AssetBalance]:
    """The account's balance rows (balance_rows), only `currency`'s when given."""
    return [row for row in balance_rows(user=user) if currency is None or row.asset.code == currency]


class HistoryRow(NamedTuple):
    posting_id: int
    kind: str  # the posting's business type
    created_at: datetime
    changed: Decimal  # the signed net change of the account's balance (free plus locked)


@dataclass(frozen=True, slots=True)
class HistoryPage:
    asset: Asset
    page: int  # from 1
    rows: list[HistoryRow]
    has_next: bool


# A posting's created_at is taken right before the statement that gives it its id (ledger.post, after
# its locks), so the two orders differ by that statement's time plus the clock difference between the
# application and database servers. This margin bounds both with room to spare.
POSTING_TIME_MARGIN = timedelta(hours=1)


def posting_id_bounds(
    start: datetime, end: datetime, *, using: str = replicas.PRIMARY
) -> tuple[int | None, int | None]:
    """Posting ids (lower, upper), exclusive, that every posting created within [start, end] lies
    between (None: no bound): the last posting created before start - margin, the first created
    after end + margin (two look-ups on the created_at index). Both were given their ids more than
    a margin's worth of clock away from any posting of the window, so on the right side of it.
    The upper bound is only sought among postings dated up to now, and only when end + margin is
    past: a posting dated in the future by a wrong clock is never taken for one."""
    postings = Posting.objects.using(using).values_list("id", flat=True)
    try:
        before = start - POSTING_TIME_MARGIN
    except OverflowError:  # the first representable hour: nothing is before it
        before = None
    try:
        after = end + POSTING_TIME_MARGIN
    except OverflowError:  # the last representable hour
        after = None
    lower = postings.filter(created_at__lt=before).order_by("-created_at").first() if before is not None else None
    now = timezone.now()
    upper = None
    if after is not None and after < now:
        upper = postings.filter(created_at__gt=after, created_at__lte=now).order_by("created_at").first()
    return lower, upper


def transaction_history(
    *, user: User, asset: Asset, start: datetime, end: datetime, page: int, size: int
) -> HistoryPage:
    """The account's postings in `asset` within [start, end], oldest first, with their signed net
    change (a hold from free to locked changes nothing and is not listed). The account's entries
    are read from the id range of the window (posting_id_bounds), not from its first posting on.
    May come from the replica (exchange/runtime/replicas.py) unless the account posted lately."""

    def read(alias: str) -> HistoryPage:
        return _history_page(alias, user, asset, start, end, page, size)

    return replicas.history_read(read, account_ids=[user.pk])


def _history_page(alias, user, asset, start, end, page, size) -> HistoryPage:
    offset = (page - 1) * size
    entries = Entry.objects.using(alias).filter(
        account=user, asset=asset, posting__created_at__gte=start, posting__created_at__lte=end
    )
    lower, upper = posting_id_bounds(start, end, using=alias)
    if lower is not None:
        entries = entries.filter(posting_id__gt=lower)
    if upper is not None:
        entries = entries.filter(posting_id__lt=upper)
    if connections[alias].vendor == "postgresql":
        rows = list(
            entries.values("posting_id", "posting__kind", "posting__created_at")
            .annotate(changed=Sum(F("side") * F("amount")))
            .exclude(changed=0)
            .order_by("posting_id")[offset : offset + size + 1]
        )
    else:  # SQLite sums NUMERIC columns as floating point: add the Decimals here (embedded mode)
        grouped: dict[int, dict] = {}
        for posting_id, kind, created, side, amount in entries.order_by("posting_id").values_list(
            "posting_id", "posting__kind", "posting__created_at", "side", "amount"
        ):
            row = grouped.setdefault(
                posting_id,
                {
                    "posting_id": posting_id,
                    "posting__kind": kind,
                    "posting__created_at": created,
                    "changed": Decimal(0),
                },
            )
            row["changed"] += side * amount
        rows = [row for row in grouped.values() if row["changed"] != 0][offset : offset + size + 1]
    return HistoryPage(
        asset=asset,
        page=page,
        rows=[
            HistoryRow(row["posting_id"], row["posting__kind"], row["posting__created_at"], row["changed"])
            for row in rows[:size]
        ],
        has_next=len(rows) > size,
    )
