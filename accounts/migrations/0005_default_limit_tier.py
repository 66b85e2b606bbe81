from decimal import Decimal

from django.db import migrations

DEFAULT_LIMITS = {
    "daily": Decimal("500000"),
    "monthly": Decimal("5000000"),
    "annually": Decimal("60000000"),
}


def seed(apps, schema_editor):
    LimitTier = apps.get_model("accounts", "LimitTier")
    TierLimit = apps.get_model("accounts", "TierLimit")
    if LimitTier.objects.filter(is_default=True).exists():
        return
    tier = LimitTier.objects.create(name="Standard", currency="PHP", is_default=True)
    for period, amount in DEFAULT_LIMITS.items():
        TierLimit.objects.create(
            tier=tier, period=period, cash_in_limit=amount, cash_out_limit=amount, total_withdraw_limit=amount
        )


class Migration(migrations.Migration):
    dependencies = [("accounts", "0004_manual_adjustment")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
