"""Reads for the dashboard and the customer page. Every figure comes from running state (Balance rows,
the business tables' current rows, the activity rollup), never from summing the journal per view."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection
from django.db.models import Q, Sum
from django.urls import reverse
from django.utils import timezone

from accounts.ledger.models import Asset, Balance, BalanceChange, Entry, LedgerCheckRun, Posting
from accounts.ledger.posting import decimal_from_db
from accounts.models import ApiKey, SystemRole, User
from accounts.phones import normalise_phone
from convert.models import Order
from exchange.api.models import RateLimitBan
from exchange.dashboard import activity
from exchange.platform.selectors import business_status_list
from streams.models import ListenKey
from subaccounts.models import CollectionStatus, FundCollection, SubAccountTransfer
from wallet.models import Deposit, DepositStatus, Transfer, Withdrawal, WithdrawalStage

ZERO = Decimal(0)
HOUSE_ROLES = [SystemRole.WORLD, SystemRole.FEES, SystemRole.CONVERT_LIQUIDITY, SystemRole.EQUITY]
OPEN_WITHDRAWAL_STAGES = [WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING]
UNFINISHED_COLLECTIONS = [CollectionStatus.INIT, CollectionStatus.PROCESSING]


# --- dashboard -------------------------------------------------------------------------------------


@dataclass
class AssetPosition:
    code: str
    customers_free: Decimal = ZERO
    customers_locked: Decimal = ZERO
    house: dict[str, Decimal] = field(default_factory=dict)  # role -> free + locked over its shards

    @property
    def customers_total(self) -> Decimal:
        return self.customers_free + self.customers_locked

    @property
    def book_sum(self) -> Decimal:
        """Customers plus every house account: zero when the book balances."""
        return self.customers_total + sum(self.house.values(), ZERO)


@dataclass
class CheckStatus:
    run: LedgerCheckRun | None
    overdue: bool
    interval_seconds: float

    @property
    def alarm(self) -> bool:
        return self.run is None or not self.run.ok or self.overdue


@dataclass
class Queue:
    name: str
    count: int
    url: str


def _sum_balances(balances) -> dict[tuple[int, int], list[Decimal]]:
    """{(account id or 0, asset id): [free, locked]} (SQLite: added in Python, exactly)."""
    out: dict[tuple[int, int], list[Decimal]] = defaultdict(lambda: [ZERO, ZERO])
    if connection.vendor == "postgresql":
        for row in balances.values("asset_id").annotate(free=Sum("free"), locked=Sum("locked")).order_by():
            out[(0, row["asset_id"])] = [row["free"] or ZERO, row["locked"] or ZERO]
        return out
    for asset_id, free, locked in balances.values_list("asset_id", "free", "locked"):
        out[(0, asset_id)][0] += decimal_from_db(free)
        out[(0, asset_id)][1] += decimal_from_db(locked)
    return out


def positions_list() -> list[AssetPosition]:
    """Per asset: the customers' balances (free, locked) and each house role's holdings."""
    house = dict(User.objects.filter(system_role__isnull=False).values_list("id", "system_role"))
    codes = dict(Asset.objects.values_list("id", "code"))
    positions = {asset_id: AssetPosition(code) for asset_id, code in sorted(codes.items(), key=lambda kv: kv[1])}
    for (_, asset_id), (free, locked) in _sum_balances(Balance.objects.exclude(account_id__in=list(house))).items():
        positions[asset_id].customers_free, positions[asset_id].customers_locked = free, locked
    for position in positions.values():
        position.house = {role.value: ZERO for role in HOUSE_ROLES}
    for account_id, asset_id, free, locked in Balance.objects.filter(account_id__in=list(house)).values_list(
        "account_id", "asset_id", "free", "locked"
    ):
        role = house[account_id]
        positions[asset_id].house[role] = (
            positions[asset_id].house.get(role, ZERO) + decimal_from_db(free) + decimal_from_db(locked)
        )
    return list(positions.values())


def ledger_check_interval() -> float:
    entry = getattr(settings, "CELERY_BEAT_SCHEDULE", {}).get("ledger-check", {})
    schedule = entry.get("schedule", 3600.0)
    return schedule.total_seconds() if hasattr(schedule, "total_seconds") else float(schedule)


def ledger_check_status(*, now: datetime | None = None) -> CheckStatus:
    """The latest recorded ledger check. Overdue: none started within twice the beat interval
    (one run missed) plus a grace of DASHBOARD_CHECK_GRACE_SECONDS (default 300) for a long run."""
    now = now or timezone.now()
    interval = ledger_check_interval()
    grace = float(getattr(settings, "DASHBOARD_CHECK_GRACE_SECONDS", 300))
    run = LedgerCheckRun.objects.order_by("-started_at").first()
    overdue = run is None or run.started_at < now - timedelta(seconds=2 * interval + grace)
    return CheckStatus(run, overdue, interval)


def _changelist(model, **params) -> str:
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def stuck_broadcasting_cutoff(now: datetime | None = None) -> datetime:
    """Withdrawals in BROADCASTING not touched for longer than the retry time (the retry job
    claims them by touching updated_at; one still BROADCASTING past this is stuck)."""
    now = now or timezone.now()
    return (now - timedelta(seconds=settings.WITHDRAWAL_RETRY_AFTER_SECONDS)).replace(microsecond=0)


def queues_list(*, now: datetime | None = None) -> list[Queue]:
    cutoff = stuck_broadcasting_cutoff(now)
    return [
        Queue(
            "Withdrawals awaiting approval",
            Withdrawal.objects.filter(stage=WithdrawalStage.AWAITING_APPROVAL).count(),
            _changelist(Withdrawal, stage__exact=WithdrawalStage.AWAITING_APPROVAL),
        ),
        Queue(
            "Deposits waiting for travel-rule data (NEED_FILL_DATA)",
            Deposit.objects.filter(status=DepositStatus.NEED_FILL_DATA).count(),
            _changelist(Deposit, status__exact=DepositStatus.NEED_FILL_DATA),
        ),
        Queue(
            "Withdrawals stuck in BROADCASTING past the retry time",
            Withdrawal.objects.filter(stage=WithdrawalStage.BROADCASTING, updated_at__lt=cutoff).count(),
            _changelist(Withdrawal, stage__exact=WithdrawalStage.BROADCASTING, updated_at__lt=cutoff.isoformat()),
        ),
        Queue(
            "Collection tasks not finished",
            FundCollection.objects.filter(status__in=UNFINISHED_COLLECTIONS).count(),
            _changelist(FundCollection, status__in=",".join(UNFINISHED_COLLECTIONS)),
        ),
    ]


def active_bans_list(*, now: datetime | None = None, limit: int = 20) -> tuple[int, list[RateLimitBan]]:
    now = now or timezone.now()
    active = RateLimitBan.objects.filter(lifted_at__isnull=True, expires_at__gt=now)
    return active.count(), list(active.order_by("-created_at")[:limit])


def activity_chart_data(days: list[activity.DayActivity]) -> dict:
    """The activity as the chart script reads it (json_script): labels, counts per category, and
    volumes per asset and category (strings: exact Decimals)."""
    assets = sorted({code for day in days for per_asset in day.by_category.values() for code in per_asset})
    return {
        "labels": [day.day.isoformat() for day in days],
        "categories": activity.CATEGORIES,
        "counts": {
            category: [sum(count for count, _ in day.by_category[category].values()) for day in days]
            for category in activity.CATEGORIES
        },
        "volumes": {
            code: {
                category: [str(day.by_category[category].get(code, [0, ZERO])[1]) for day in days]
                for category in activity.CATEGORIES
            }
            for code in assets
        },
    }


def activity_table(days: list[activity.DayActivity]) -> list[dict]:
    """Rows of the activity table, newest day first: one per day, category and asset with activity."""
    rows = []
    for day in reversed(days):
        for category in activity.CATEGORIES:
            for code, (count, volume) in sorted(day.by_category[category].items()):
                rows.append({"day": day.day, "category": category, "asset": code, "count": count, "volume": volume})
    return rows


def dashboard_get(*, now: datetime | None = None) -> dict:
    now = now or timezone.now()
    fold_above = int(getattr(settings, "DASHBOARD_FOLD_IN_VIEW_POSTINGS", 20_000))
    if activity.unfolded_postings() > fold_above:
        # The periodic fold is behind (or not scheduled): catch up here rather than aggregate a long
        # tail on every view. Never waits for a fold already running elsewhere.
        activity.activity_fold(wait=False)
    days = activity.activity_read(days=30, today=now.date())
    ban_count, bans = active_bans_list(now=now)
    return {
        "positions": positions_list(),
        "check": ledger_check_status(now=now),
        "queues": queues_list(now=now),
        "activity_chart": activity_chart_data(days),
        "activity_rows": activity_table(days),
        "statuses": business_status_list(),
        "ban_count": ban_count,
        "bans": bans,
        "now": now,
    }


# --- customer page ---------------------------------------------------------------------------------


def customer_search(query: str) -> list[User]:
    """Accounts (never the house's) by user id, e-mail (exact, case-insensitive) or phone (compared
    normalised, as stored: accounts/phones.py)."""
    query = query.strip()
    if not query:
        return []
    match = Q(email__iexact=query) | Q(phone=normalise_phone(query) or query)
    if query.isdigit():
        match |= Q(pk=int(query))
    return list(User.objects.filter(match, system_role__isnull=True).order_by("id")[:20])


@dataclass
class PostingView:
    posting: Posting
    entries: list[Entry]


def customer_get(*, user: User, postings: int = 20, rows: int = 20) -> dict:
    """What the customer page shows of one account. Every list is bounded and read through an index
    that leads with the account (the change feed's (account, seq), the transfers' and orders' keys)."""
    balances = list(Balance.objects.filter(account=user).select_related("asset").order_by("asset__code"))
    posting_ids = list(
        BalanceChange.objects.filter(account=user).order_by("-seq").values_list("posting_id", flat=True)[: postings * 4]
    )
    posting_ids = list(dict.fromkeys(posting_ids))[:postings]  # a posting may change several assets
    by_id = Posting.objects.in_bulk(posting_ids)
    entries: dict[int, list[Entry]] = defaultdict(list)
    for entry in Entry.objects.filter(posting_id__in=posting_ids).select_related("asset", "account").order_by("id"):
        entries[entry.posting_id].append(entry)
    transfers = sorted(
        [
            *Transfer.objects.filter(sender=user).select_related("asset", "sender", "recipient").order_by("-id")[:rows],
            *Transfer.objects.filter(recipient=user)
            .select_related("asset", "sender", "recipient")
            .order_by("-id")[:rows],
        ],
        key=lambda t: t.pk,
        reverse=True,
    )[:rows]
    family = user.master_id or user.pk
    return {
        "customer": user,
        "balances": balances,
        "postings": [PostingView(by_id[pk], entries[pk]) for pk in posting_ids if pk in by_id],
        "api_keys": list(ApiKey.objects.filter(user=user).order_by("-created_at")),
        "master": user.master,
        "sub_accounts": list(User.objects.filter(master=user).order_by("id")[:100]),
        "open_withdrawals": list(
            Withdrawal.objects.filter(account=user, stage__in=OPEN_WITHDRAWAL_STAGES)
            .select_related("network__coin")
            .order_by("-id")[:rows]
        ),
        "transfers": transfers,
        "subaccount_transfers": list(
            SubAccountTransfer.objects.filter(Q(from_account=user) | Q(to_account=user))
            .select_related("asset")
            .order_by("-created_at", "-id")[:rows]
        ),
        "conversions": list(
            Order.objects.filter(user=user)
            .select_related("pair__source", "pair__target")
            .order_by("-created_at", "-id")[:rows]
        ),
        "listen_keys": list(ListenKey.objects.filter(account=user).order_by("-created_at")[:rows]),
        "collections": list(FundCollection.objects.filter(master_id=family).order_by("-id")[:5])
        if user.master_id is None
        else [],
    }
