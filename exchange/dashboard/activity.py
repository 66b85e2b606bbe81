"""Daily activity for the dashboard: deposits, withdrawals, transfers and conversions per UTC day and
asset (count and volume), read from a rollup of the journal, never by summing the journal per view.

What counts (one rule per category, on a posting's entries):
- deposits: postings of a deposit kind (CHAIN_DEPOSIT, FIAT_DEPOSIT); volume = what left the outside
  world's accounts (world shards debited): the amount customers brought in;
- withdrawals: postings of a withdrawal kind that credit the outside world (the settlement; the hold
  and a release do not touch the world); volume = what was sent out (the fee is not in it);
- transfers: P2P_TRANSFER (reversals posted before issue 34 included; later ones are OTHERS, not
  counted) and VIRTUAL_DISTRIBUTE (sub-account transfers and
  collections); volume = what customers received (the fee, to a fees account, is not in it);
- conversions: CONVERT; volume per asset = what customers gave in that asset plus what they got in
  it (a conversion counts once in its source asset and once in its target asset).
`count` is the number of postings with a non-zero volume in that asset.

How it stays cheap: `ActivityRollup.folded_through` is the last posting id folded into
`DailyActivity` rows. `activity_fold()` (the periodic task `exchange.activity_rollup`, and the
dashboard itself when the unfolded tail is long) adds the postings after it, in id order, in
batches; `activity_read()` returns the rollup rows of the last N days plus the tail (postings after
the watermark: a primary-key range, a few minutes of postings) aggregated on the fly.

A posting id is taken when the posting is written, so a transaction still open could commit a lower
id after a higher one was folded. The fold therefore stops at postings older than
`DASHBOARD_ROLLUP_LAG_SECONDS` (default 60; postings are written in short transactions); the tail
read by the page has no such lag. `manage.py activity_rollup --rebuild` recomputes the rollup from
the journal (e.g. after restoring a backup).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, CharField, Max, Q, Value, When
from django.db.models.functions import TruncDate
from django.utils import timezone

from accounts.ledger.models import Entry, Posting
from accounts.ledger.posting import decimal_from_db
from accounts.models import SystemRole, User
from exchange.dashboard.models import ActivityCategory, ActivityRollup, DailyActivity

DEPOSIT_KINDS = ("CHAIN_DEPOSIT", "FIAT_DEPOSIT")
WITHDRAWAL_KINDS = ("CHAIN_WITHDRAWAL", "FIAT_WITHDRAWAL")
TRANSFER_KINDS = ("P2P_TRANSFER", "VIRTUAL_DISTRIBUTE")
CONVERSION_KINDS = ("CONVERT",)
CATEGORIES = [c.value for c in ActivityCategory]
ZERO = Decimal(0)
FOLD_BATCH = 200_000  # postings per fold transaction

Key = tuple[date, str, int]  # (day, category, asset id)


def _lag() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "DASHBOARD_ROLLUP_LAG_SECONDS", 60)))


def _system_accounts() -> tuple[list[int], list[int]]:
    """(world account ids, every house account id), shards included."""
    system = list(User.objects.filter(system_role__isnull=False).values_list("id", "system_role"))
    return [pk for pk, role in system if role == SystemRole.WORLD], [pk for pk, _ in system]


# PostgreSQL: the id range is given on both tables, so the planner reads both by their id indexes
# (with the range on the entries only, it scanned the whole posting table: 285 ms for a 20,000-posting
# tail of a 1,000,000-posting journal).
_TAIL_SQL = """
SELECT day, category, asset_id, count(DISTINCT posting_id), sum(amount) FROM (
    SELECT (p.created_at AT TIME ZONE 'UTC')::date AS day, e.asset_id, e.posting_id, e.amount,
        CASE
            WHEN p.kind = ANY(%(deposit_kinds)s) AND e.account_id = ANY(%(world)s) AND e.side = -1 THEN 'deposits'
            WHEN p.kind = ANY(%(withdrawal_kinds)s) AND e.account_id = ANY(%(world)s) AND e.side = 1 THEN 'withdrawals'
            WHEN p.kind = ANY(%(transfer_kinds)s) AND e.side = 1 AND NOT e.account_id = ANY(%(house)s) THEN 'transfers'
            WHEN p.kind = ANY(%(conversion_kinds)s) AND NOT e.account_id = ANY(%(house)s) THEN 'conversions'
        END AS category
    FROM accounts_posting p JOIN accounts_entry e ON e.posting_id = p.id
    WHERE p.id > %(after)s AND p.id <= %(through)s AND e.posting_id > %(after)s AND e.posting_id <= %(through)s
        AND p.kind = ANY(%(kinds)s)
) AS classified
WHERE category IS NOT NULL
GROUP BY day, category, asset_id
"""


def activity_of_postings(*, after: int, through: int | None = None) -> dict[Key, list]:
    """{(day, category, asset id): [count, volume]} of the postings with after < id <= through
    (no upper bound without `through`), from their entries: a primary-key range of the journal."""
    world, house = _system_accounts()
    if connection.vendor == "postgresql":
        params = {
            "after": after,
            "through": through if through is not None else 2**62,
            "world": world,
            "house": house,
            "deposit_kinds": list(DEPOSIT_KINDS),
            "withdrawal_kinds": list(WITHDRAWAL_KINDS),
            "transfer_kinds": list(TRANSFER_KINDS),
            "conversion_kinds": list(CONVERSION_KINDS),
            "kinds": list(DEPOSIT_KINDS + WITHDRAWAL_KINDS + TRANSFER_KINDS + CONVERSION_KINDS),
        }
        with connection.cursor() as cursor:
            cursor.execute(_TAIL_SQL, params)
            return {(day, category, asset_id): [count, volume] for day, category, asset_id, count, volume in cursor}
    # SQLite (embedded mode, small journals): the same rules through the ORM, the Decimals added here
    # (SQLite adds NUMERIC in floating point).
    customer = ~Q(account_id__in=house)
    category = Case(
        When(Q(posting__kind__in=DEPOSIT_KINDS, account_id__in=world, side=-1), then=Value("deposits")),
        When(Q(posting__kind__in=WITHDRAWAL_KINDS, account_id__in=world, side=1), then=Value("withdrawals")),
        When(Q(posting__kind__in=TRANSFER_KINDS, side=1) & customer, then=Value("transfers")),
        When(Q(posting__kind__in=CONVERSION_KINDS) & customer, then=Value("conversions")),
        default=None,
        output_field=CharField(),
    )
    entries = Entry.objects.filter(posting_id__gt=after)
    if through is not None:
        entries = entries.filter(posting_id__lte=through)
    entries = entries.annotate(category=category, day=TruncDate("posting__created_at", tzinfo=UTC)).filter(
        category__isnull=False
    )
    postings: dict[Key, set[int]] = defaultdict(set)
    volumes: dict[Key, Decimal] = defaultdict(lambda: ZERO)
    for day, name, asset_id, posting_id, amount in entries.values_list(
        "day", "category", "asset_id", "posting_id", "amount"
    ).order_by():
        key = (day if isinstance(day, date) else date.fromisoformat(str(day)), name, asset_id)
        postings[key].add(posting_id)
        volumes[key] += decimal_from_db(amount)
    return {key: [len(postings[key]), volumes[key]] for key in postings}


def activity_fold(*, batch: int = FOLD_BATCH, wait: bool = True) -> int:
    """Fold the journal's postings older than the lag into DailyActivity, in batches of `batch`
    postings; returns how many posting ids were folded past. One folder at a time (the rollup row's
    lock); with wait=False, returns 0 at once when another folder holds it."""
    ActivityRollup.objects.get_or_create(pk=1)
    moved = 0
    while True:
        with transaction.atomic():
            state = ActivityRollup.objects.select_for_update(skip_locked=not wait).filter(pk=1).first()
            if state is None:  # another folder holds it (skip_locked)
                return moved
            low = state.folded_through
            cutoff = timezone.now() - _lag()
            high = Posting.objects.filter(id__gt=low, id__lte=low + batch, created_at__lt=cutoff).aggregate(
                high=Max("id")
            )["high"]
            if high is None:
                return moved
            for (day, category, asset_id), (count, volume) in activity_of_postings(after=low, through=high).items():
                row = DailyActivity.objects.select_for_update().filter(day=day, category=category, asset_id=asset_id)
                current = row.first()
                if current is None:
                    DailyActivity.objects.create(
                        day=day, category=category, asset_id=asset_id, count=count, volume=volume
                    )
                else:
                    row.update(count=current.count + count, volume=current.volume + volume)
            ActivityRollup.objects.filter(pk=1).update(folded_through=high, updated_at=timezone.now())
            moved += high - low


def activity_rebuild() -> int:
    """Recompute the rollup from the whole journal (one transaction)."""
    with transaction.atomic():
        ActivityRollup.objects.get_or_create(pk=1)
        ActivityRollup.objects.select_for_update().filter(pk=1).update(folded_through=0, updated_at=timezone.now())
        DailyActivity.objects.all().delete()
        return activity_fold()


def unfolded_postings() -> int:
    """About how many postings the rollup has not folded yet (an id difference: no count query)."""
    state = ActivityRollup.objects.filter(pk=1).values_list("folded_through", flat=True).first() or 0
    newest = Posting.objects.order_by("-id").values_list("id", flat=True).first() or 0
    return max(0, newest - state)


@dataclass
class DayActivity:
    day: date
    # {category: {asset code: [count, volume]}}
    by_category: dict[str, dict[str, list]]


def activity_read(*, days: int = 30, today: date | None = None) -> list[DayActivity]:
    """The last `days` UTC days (oldest first, today included): the rollup plus the unfolded tail."""
    from accounts.models import Asset

    today = today or datetime.now(UTC).date()
    since = today - timedelta(days=days - 1)
    codes = dict(Asset.objects.values_list("id", "code"))
    totals: dict[Key, list] = defaultdict(lambda: [0, ZERO])
    for row in DailyActivity.objects.filter(day__gte=since).values_list(
        "day", "category", "asset_id", "count", "volume"
    ):
        day, category, asset_id, count, volume = row
        totals[(day, category, asset_id)][0] += count
        totals[(day, category, asset_id)][1] += decimal_from_db(volume)
    folded = ActivityRollup.objects.filter(pk=1).values_list("folded_through", flat=True).first() or 0
    for key, (count, volume) in activity_of_postings(after=folded).items():
        if key[0] >= since:
            totals[key][0] += count
            totals[key][1] += volume
    result = []
    for offset in range(days):
        day = since + timedelta(days=offset)
        by_category: dict[str, dict[str, list]] = {category: {} for category in CATEGORIES}
        result.append(DayActivity(day, by_category))
    index = {entry.day: entry for entry in result}
    for (day, category, asset_id), (count, volume) in totals.items():
        if day in index and count:
            index[day].by_category[category][codes.get(asset_id, str(asset_id))] = [count, volume]
    return result
