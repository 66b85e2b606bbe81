"""The dashboard's daily activity rollup (exchange/dashboard/activity.py). Empty at first: the
periodic fold (or the dashboard, when the unfolded tail is long) fills it from the journal."""

from decimal import Decimal

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0013_system_role_shards"),
        ("exchange", "0002_seed_business_status"),
    ]

    operations = [
        migrations.CreateModel(
            name="ActivityRollup",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("folded_through", models.BigIntegerField(default=0)),
                ("updated_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name="DailyActivity",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("day", models.DateField()),
                (
                    "category",
                    models.CharField(
                        choices=[
                            ("deposits", "Deposits"),
                            ("withdrawals", "Withdrawals"),
                            ("transfers", "Transfers"),
                            ("conversions", "Conversions"),
                        ],
                        max_length=16,
                    ),
                ),
                ("count", models.BigIntegerField(default=0)),
                ("volume", models.DecimalField(decimal_places=18, default=Decimal("0"), max_digits=36)),
                (
                    "asset",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="accounts.asset"
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "daily activity",
                "ordering": ["-day", "category", "asset"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("day", "category", "asset"), name="daily_activity_per_day_category_asset"
                    )
                ],
            },
        ),
    ]
