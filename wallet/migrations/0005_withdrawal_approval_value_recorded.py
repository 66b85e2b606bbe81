"""The four-eyes decision of a withdrawal is recorded on its row when it is applied (issue 25,
finding 2). Open withdrawals of earlier versions get theirs here, at today's reference prices; one
whose asset has no price needs two approvers (fail closed)."""

from decimal import Decimal

from django.conf import settings
from django.db import migrations, models

OPEN = ("AWAITING_APPROVAL", "QUEUED", "BROADCASTING")


def record_open_withdrawals(apps, schema_editor):
    Withdrawal = apps.get_model("wallet", "Withdrawal")
    above = settings.WITHDRAWAL_FOUR_EYES_ABOVE
    for withdrawal in Withdrawal.objects.filter(stage__in=OPEN).select_related("network__coin"):
        coin = withdrawal.network.coin
        total = withdrawal.amount + withdrawal.fee
        if coin.code == "PHP":
            value = total
        elif coin.reference_price and coin.reference_price > 0:
            value = (total * coin.reference_price).quantize(Decimal("1E-8"))
        else:
            value = None
        withdrawal.approval_value = value
        withdrawal.needs_two_approvals = above is not None and (value is None or value > above)
        withdrawal.save(update_fields=["approval_value", "needs_two_approvals"])


class Migration(migrations.Migration):
    dependencies = [
        ("wallet", "0004_open_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="withdrawal",
            name="approval_value",
            field=models.DecimalField(
                blank=True,
                decimal_places=18,
                help_text="Amount plus fee in the approval currency (PHP) at the reference price when applied.",
                max_digits=36,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="withdrawal",
            name="needs_two_approvals",
            field=models.BooleanField(
                default=False,
                help_text="Decided when applied (or later raised, never lowered): two approvers, not one.",
            ),
        ),
        migrations.RunPython(record_open_withdrawals, migrations.RunPython.noop),
    ]
