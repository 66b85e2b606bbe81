"""The embedded mode's revocation log in the database (issue 34, finding 4): a counter row and its
entries, read by every process without Redis (accounts/keyring.py)."""

import django.utils.timezone
from django.db import migrations, models


def seed_counter(apps, schema_editor):
    apps.get_model("accounts", "RevocationSequence").objects.get_or_create(pk=1, defaults={"value": 0})


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0015_s42a_phone_normalised_unique"),
    ]

    operations = [
        migrations.CreateModel(
            name="RevocationSequence",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("value", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="RevocationLog",
            fields=[
                ("seq", models.BigIntegerField(primary_key=True, serialize=False)),
                ("account_id", models.BigIntegerField()),
                ("at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={"ordering": ["seq"]},
        ),
        migrations.RunPython(seed_counter, migrations.RunPython.noop),
    ]
