"""The ledger's tables. Balances are a cache of the journal that the database keeps honest:
non-negative (except the outside world's accounts), entries positive and append-only, every
posting summing to zero per asset (a deferred trigger on PostgreSQL, see the migration)."""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import Q

from exchange.runtime.amounts import AMOUNT_DIGITS, AMOUNT_PLACES, QUANTUM  # noqa: F401 - QUANTUM: re-exported
from exchange.runtime.ttlcache import ReferenceQuerySet


def AmountField(**kwargs) -> models.DecimalField:
    return models.DecimalField(max_digits=AMOUNT_DIGITS, decimal_places=AMOUNT_PLACES, **kwargs)


class BusinessType(models.TextChoices):
    """The spec's BS values, one per posting."""

    CHAIN_DEPOSIT = "CHAIN_DEPOSIT"
    FIAT_DEPOSIT = "FIAT_DEPOSIT"
    TRADE = "TRADE"
    FEE = "FEE"
    FIAT_WITHDRAWAL = "FIAT_WITHDRAWAL"
    CHAIN_WITHDRAWAL = "CHAIN_WITHDRAWAL"
    CONVERT = "CONVERT"
    DISTRIBUTION = "DISTRIBUTION"
    P2P_TRANSFER = "P2P_TRANSFER"
    SPOT_TO_CREDIT = "SPOT_TO_CREDIT"
    CREDIT_TO_SPOT = "CREDIT_TO_SPOT"
    VIRTUAL_DISTRIBUTE = "VIRTUAL_DISTRIBUTE"
    OTHERS = "OTHERS"


class Asset(models.Model):
    code = models.CharField(max_length=16, unique=True, help_text="e.g. BTC, USDT, PHP")
    name = models.CharField(max_length=64)
    transfer_precision = models.PositiveSmallIntegerField(
        default=8, help_text="Decimal places allowed in transfers and withdrawals."
    )
    transfer_min_quantity = AmountField(default=Decimal(0), help_text="Smallest transfer amount.")
    is_fiat = models.BooleanField(default=False)
    reference_price = AmountField(
        default=Decimal(0),
        help_text="Price of one unit in the limits currency (the account tier's), for daily/monthly/annual limits.",
    )

    objects = ReferenceQuerySet.as_manager()  # cached per process (accounts.selectors.asset_by_code, convert's pairs)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return self.code


class LedgerAccount(models.Model):
    """Per-account ledger state: the row every posting locks first (in id order), and the sequence
    of its change-feed rows."""

    user = models.OneToOneField("accounts.User", primary_key=True, on_delete=models.PROTECT, related_name="ledger")
    seq = models.BigIntegerField(default=0)
    allow_negative = models.BooleanField(default=False, help_text="Only the outside world's system accounts.")
    track_limits = models.BooleanField(
        default=True, help_text="Keep limit counters (customers); the service's own accounts have no limits."
    )
    may_send = models.BooleanField(
        default=True,
        db_default=True,  # also for raw INSERTs (ledger._open_ledger_accounts)
        editable=False,
        help_text="Kept by the database from the account (active, not frozen, may withdraw, not a system "
        "account): read under the posting's lock, so a freeze stops every later movement out.",
    )

    def __str__(self) -> str:
        return f"ledger of {self.user_id}"


_POSTINGS_ONLY = "Balances change only through accounts.ledger.post()."


class _PostingsOnly(models.QuerySet):
    """Balances change only through accounts.ledger.post(), under the accounts' ledger locks: that
    is what keeps the balances a posting reads stable until it writes. ORM writes are refused
    (migrations use historical models and are not affected)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError(_POSTINGS_ONLY)

    update = delete = bulk_create = bulk_update = update_or_create = get_or_create = create = _refuse


class Balance(models.Model):
    # No index of its own: unique constraint (account, asset) leads with the account.
    account = models.ForeignKey("accounts.User", on_delete=models.PROTECT, db_index=False, related_name="balances")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    free = AmountField(default=Decimal(0))
    locked = AmountField(default=Decimal(0))
    allow_negative = models.BooleanField(default=False)
    updated_at = models.DateTimeField()

    objects = _PostingsOnly.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["account", "asset"], name="balance_one_per_account_asset"),
            models.CheckConstraint(
                condition=Q(locked__gte=0) & (Q(free__gte=0) | Q(allow_negative=True)), name="balance_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.account_id} {self.asset_id}: {self.free} free, {self.locked} locked"

    def save(self, *args, **kwargs):
        raise TypeError(_POSTINGS_ONLY)

    def delete(self, *args, **kwargs):
        raise TypeError(_POSTINGS_ONLY)


class Posting(models.Model):
    """One balanced movement of money: its entries sum to zero per asset."""

    kind = models.CharField(max_length=24, choices=BusinessType.choices)
    reference = models.CharField(
        max_length=200, unique=True, help_text="Business key; unique, so a retry cannot post twice."
    )
    memo = models.CharField(max_length=255, blank=True)
    actor = models.ForeignKey(
        "accounts.User",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Staff who posted it.",
    )
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind} {self.reference}"


class Bucket(models.TextChoices):
    FREE = "F", "free"
    LOCKED = "L", "locked"


class Entry(models.Model):
    posting = models.ForeignKey(Posting, on_delete=models.PROTECT, related_name="entries")
    # No index of its own: index entry_account_asset_posting leads with the account.
    account = models.ForeignKey("accounts.User", on_delete=models.PROTECT, db_index=False, related_name="+")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    bucket = models.CharField(max_length=1, choices=Bucket.choices)
    side = models.SmallIntegerField(help_text="+1 credit (balance grows), -1 debit.")
    amount = AmountField()

    class Meta:
        verbose_name_plural = "entries"
        indexes = [models.Index(fields=["account", "asset", "posting"], name="entry_account_asset_posting")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="entry_amount_positive"),
            models.CheckConstraint(condition=Q(side__in=[-1, 1]), name="entry_side_sign"),
        ]

    def __str__(self) -> str:
        sign = "+" if self.side > 0 else "-"
        return f"{sign}{self.amount} {self.asset_id} {self.get_bucket_display()} @ {self.account_id}"


class BalanceChange(models.Model):
    """The change feed: one row per account and asset a posting changed, written in the posting's
    transaction. streams publishes these (an event can never describe an uncommitted change)."""

    # No index of its own: unique constraint (account, seq) leads with the account.
    account = models.ForeignKey("accounts.User", on_delete=models.PROTECT, db_index=False, related_name="+")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    posting = models.ForeignKey(Posting, on_delete=models.PROTECT, related_name="changes")
    kind = models.CharField(max_length=24, choices=BusinessType.choices)
    seq = models.BigIntegerField(help_text="Per-account order.")
    delta_free = AmountField()
    delta_locked = AmountField()
    free_after = AmountField()
    locked_after = AmountField()
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "seq"], name="change_seq_per_account")]
        indexes = [
            models.Index(fields=["id"], condition=Q(published_at__isnull=True), name="change_unpublished"),
        ]

    def __str__(self) -> str:
        return f"{self.account_id} {self.asset_id} #{self.seq}: free {self.free_after}, locked {self.locked_after}"


class LimitSpan(models.TextChoices):
    DAY = "D", "day"
    MONTH = "M", "month"
    YEAR = "Y", "year"


class LimitCounter(models.Model):
    """Running totals of the movements that count against an account's limits, per asset and
    calendar period (UTC day, month, year), in the asset's own units: written by `post()` in the
    posting's transaction, under the account's lock, so a limit check reads a few rows instead of
    summing the journal. The journal stays the truth: the ledger check recomputes the current
    periods' counters from it.

    deposits, withdrawals: net free-balance change by deposit / withdrawal postings (a withdrawal's
    hold is negative, its release positive); p2p_in, p2p_out: transfers received / sent."""

    # No index of its own: unique constraint (account, span, period_start, asset) leads with the account.
    account = models.ForeignKey("accounts.User", on_delete=models.PROTECT, db_index=False, related_name="+")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    span = models.CharField(max_length=1, choices=LimitSpan.choices)
    period_start = models.DateField()
    deposits = AmountField(default=Decimal(0))
    withdrawals = AmountField(default=Decimal(0))
    p2p_in = AmountField(default=Decimal(0))
    p2p_out = AmountField(default=Decimal(0))

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["account", "span", "period_start", "asset"], name="limit_counter_per_period"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.account_id} {self.asset_id} {self.span} {self.period_start}"


class LedgerCheckRun(models.Model):
    """A result of the ledger check (command or periodic task), for the admin."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    ok = models.BooleanField()
    postings = models.BigIntegerField(default=0)
    balances = models.BigIntegerField(default=0)
    report = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"ledger check {self.started_at:%Y-%m-%d %H:%M:%S}: {'OK' if self.ok else 'DRIFT'}"


class AdjustmentStatus(models.TextChoices):
    PROPOSED = "PROPOSED", "proposed (no money moved)"
    CONFIRMED = "CONFIRMED", "confirmed (posted)"
    CANCELLED = "CANCELLED", "cancelled"


class ManualAdjustment(models.Model):
    """An operator's correction, under four eyes: one staff member PROPOSES it (no money moves),
    another CONFIRMS it, and only then is it posted: a balanced posting between the account and the
    equity account, written with the confirmation in one transaction, once (the row is locked and
    moved from PROPOSED; the posting's reference is unique). The database refuses a confirmation by
    the proposer and a confirmed row without its posting. Made only through
    ledger.services.adjustment_propose / adjustment_confirm / adjustment_cancel."""

    account = models.ForeignKey("accounts.User", on_delete=models.PROTECT, related_name="+")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    amount = AmountField(help_text="Positive credits the account, negative debits it.")
    reason = models.CharField(max_length=255)
    status = models.CharField(
        max_length=10,
        choices=AdjustmentStatus.choices,
        db_default=AdjustmentStatus.CONFIRMED,  # adjustments made before four eyes were posted at once
    )
    request_id = models.UUIDField(
        null=True,
        blank=True,
        unique=True,
        help_text="Made when the form is shown: a resend proposes once.",
    )
    created_by = models.ForeignKey(
        "accounts.User", on_delete=models.PROTECT, related_name="+", help_text="Who proposed it."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        "accounts.User",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Who confirmed or cancelled it (never the proposer for a confirmation).",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=255, blank=True, db_default="")
    posting = models.OneToOneField(Posting, null=True, blank=True, on_delete=models.PROTECT, related_name="adjustment")

    class Meta:
        ordering = ["-created_at"]
        permissions = [("confirm_manualadjustment", "Can confirm or cancel an adjustment someone else proposed")]
        constraints = [
            models.CheckConstraint(
                condition=(Q(status=AdjustmentStatus.CONFIRMED) & Q(posting__isnull=False))
                | (~Q(status=AdjustmentStatus.CONFIRMED) & Q(posting__isnull=True)),
                name="adjustment_posted_iff_confirmed",
            ),
            models.CheckConstraint(
                condition=~Q(status=AdjustmentStatus.CONFIRMED)
                | Q(decided_by__isnull=True)
                | ~Q(decided_by=models.F("created_by")),
                name="adjustment_four_eyes",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.amount} {self.asset} to {self.account} ({self.reason}) [{self.status}]"
