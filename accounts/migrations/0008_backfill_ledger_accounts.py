from django.db import migrations


def backfill(apps, schema_editor):
    """Accounts created before the ledger get their ledger row now (new ones get it at creation)."""
    User = apps.get_model("accounts", "User")
    LedgerAccount = apps.get_model("accounts", "LedgerAccount")
    have = set(LedgerAccount.objects.values_list("user_id", flat=True))
    LedgerAccount.objects.bulk_create(
        [LedgerAccount(user_id=pk, seq=0, allow_negative=False) for pk in User.objects.values_list("pk", flat=True)
         if pk not in have],
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):
    dependencies = [("accounts", "0007_posting_reference_length")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
