"""Convert: asset prices (one per asset, in the numeraire), markets (two assets and a spread), pairs
(a direction a customer may convert in, with its limits), quotes (a firm price for a few seconds) and
orders (an accepted quote, settled by one CONVERT posting, or a failed accept kept for support).
docs/convert.md has the rules."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from accounts.ledger.models import AmountField
from exchange.runtime.ttlcache import ReferenceQuerySet


class AssetPrice(models.Model):
    """One asset's price in the numeraire (CONVERT_NUMERAIRE, e.g. PHP): every market's price is
    derived from two of these, so the prices quoted at any one moment are consistent and no cycle
    of conversions returns more than it started with (docs/convert.md, "No cycle profits").
    Operators set the anchor; the price source (convert/prices.py; the default moves `price` by a
    bounded random walk around the anchor) keeps `price` and `price_updated_at` current. The
    numeraire itself has no row: its price is 1, always."""

    asset = models.OneToOneField("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    anchor_price = AmountField(help_text="Operators' price: numeraire units per one unit of the asset.")
    price = AmountField(help_text="The current price in the numeraire (moves around the anchor).")
    price_updated_at = models.DateTimeField(help_text="When the price source last confirmed the price.")
    walk_step_bps = models.PositiveIntegerField(
        default=5, help_text="Simulated market: the largest move per tick (0: the price stays at the anchor)."
    )
    walk_band_bps = models.PositiveIntegerField(
        default=300, help_text="Simulated market: the price stays within this distance of the anchor."
    )

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(anchor_price__gt=0) & Q(price__gt=0), name="asset_price_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.asset.code} price"


class Market(models.Model):
    """Two assets customers may convert between, and the spread the house takes on each leg. Its
    price (`quote` units per one `base` unit) is not stored: it is derived from the two assets'
    prices in the numeraire (AssetPrice) by the price source."""

    base = models.ForeignKey("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    quote = models.ForeignKey("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    spread_bps = models.PositiveIntegerField(
        default=20, help_text="Taken from the customer's side of every quote, both ways (1 bp = 0.01%)."
    )

    objects = ReferenceQuerySet.as_manager()  # cached per process with the pairs (convert/prices.py)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["base", "quote"], name="one_market_per_asset_pair"),
            models.CheckConstraint(condition=~Q(base=F("quote")), name="market_of_two_assets"),
        ]

    def __str__(self) -> str:
        return f"{self.base.code}/{self.quote.code}"


class Pair(models.Model):
    """A direction customers may convert in: `source` to `target`, priced by `market` (either way
    round). `precision` is the number of decimal places of the target amount."""

    source = models.ForeignKey("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    target = models.ForeignKey("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    market = models.ForeignKey(Market, on_delete=models.PROTECT, related_name="pairs")
    min_source_amount = AmountField()
    max_source_amount = AmountField()
    precision = models.PositiveSmallIntegerField(help_text="Decimal places of the target amount.")
    fee_bps = models.PositiveIntegerField(
        default=0, help_text="Fee taken in the target asset, to the fees account (1 bp = 0.01%)."
    )
    enabled = models.BooleanField(default=True)

    objects = ReferenceQuerySet.as_manager()  # cached per process (convert/prices.py)

    class Meta:
        ordering = ["source__code", "target__code"]
        constraints = [
            models.UniqueConstraint(fields=["source", "target"], name="one_pair_per_direction"),
            models.CheckConstraint(condition=~Q(source=F("target")), name="pair_of_two_assets"),
            models.CheckConstraint(
                condition=Q(min_source_amount__gt=0) & Q(max_source_amount__gte=F("min_source_amount")),
                name="pair_amount_bounds",
            ),
            models.CheckConstraint(condition=Q(precision__lte=18), name="pair_precision_at_most_18"),
            models.CheckConstraint(condition=Q(fee_bps__lt=10000), name="pair_fee_below_100_percent"),
        ]

    def __str__(self) -> str:
        return f"{self.source.code} → {self.target.code}"


class Quote(models.Model):
    """A firm price for `user`, valid until `expires_at`: `source_amount` of the source for
    `target_amount` of the target (the customer's side, after spread and fee)."""

    quote_id = models.CharField(max_length=32, unique=True, help_text="Public id (random, unguessable).")
    user = models.ForeignKey("accounts.User", on_delete=models.PROTECT, related_name="+")
    pair = models.ForeignKey(Pair, on_delete=models.PROTECT, related_name="+")
    source_amount = AmountField()
    target_amount = AmountField()
    fee = AmountField(help_text="In the target asset, on top of the target amount.")
    price = AmountField(help_text="The customer's price: target units per one source unit.")
    market_price = AmountField(help_text="The market's price in this direction when the quote was made.")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["user", "created_at"], name="convert_quote_user_time")]

    def __str__(self) -> str:
        return self.quote_id


class OrderStatus(models.TextChoices):
    TODO = "TODO"
    PROCESSING = "PROCESSING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


class Order(models.Model):
    """An accept of a quote: SUCCESS with its CONVERT posting, or FAILED with the reason. One per
    quote (a unique constraint: a quote is accepted once, whatever happens concurrently)."""

    quote = models.OneToOneField(Quote, on_delete=models.PROTECT, related_name="order")
    user = models.ForeignKey("accounts.User", on_delete=models.PROTECT, related_name="+", db_index=False)
    pair = models.ForeignKey(Pair, on_delete=models.PROTECT, related_name="+")
    source_amount = AmountField()
    target_amount = AmountField()
    fee = AmountField()
    price = AmountField()
    status = models.CharField(max_length=12, choices=OrderStatus.choices)
    error_code = models.CharField(max_length=16, blank=True)
    error_message = models.CharField(max_length=255, blank=True)
    posting = models.OneToOneField(
        "accounts.Posting", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["user", "created_at", "id"], name="convert_order_user_time")]
        constraints = [
            models.CheckConstraint(
                condition=~Q(status="SUCCESS") | Q(posting__isnull=False), name="successful_order_has_posting"
            ),
        ]

    def __str__(self) -> str:
        return f"order {self.pk}"
