"""The daily activity rollup the dashboard reads instead of the journal (exchange/dashboard/activity.py).

Registered under the app label "exchange" (the tables and migrations date from when exchange/models.py
imported this module; the dashboard is an app of its own, exchange/dashboard/apps.py)."""

from __future__ import annotations

from decimal import Decimal

from django.db import models

from accounts.ledger.models import AmountField


class ActivityCategory(models.TextChoices):
    DEPOSITS = "deposits"
    WITHDRAWALS = "withdrawals"
    TRANSFERS = "transfers"
    CONVERSIONS = "conversions"


class DailyActivity(models.Model):
    """Per UTC day, category and asset: how many postings moved money that way and how much
    (activity.py defines both from the journal). Written only by activity.activity_fold."""

    day = models.DateField()
    category = models.CharField(max_length=16, choices=ActivityCategory.choices)
    asset = models.ForeignKey("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    count = models.BigIntegerField(default=0)
    volume = AmountField(default=Decimal(0))

    class Meta:
        app_label = "exchange"
        verbose_name_plural = "daily activity"
        ordering = ["-day", "category", "asset"]
        constraints = [
            models.UniqueConstraint(fields=["day", "category", "asset"], name="daily_activity_per_day_category_asset")
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.category} {self.asset_id}: {self.count}, {self.volume}"


class ActivityRollup(models.Model):
    """One row (pk 1): the journal is folded into DailyActivity up to and including this posting id.
    The dashboard adds the postings after it (an indexed id range) when it reads."""

    folded_through = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "exchange"

    def __str__(self) -> str:
        return f"activity folded through posting {self.folded_through}"
