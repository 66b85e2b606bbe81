"""House roles split over several accounts (accounts/ledger/system.py): `system_shard`, unique with
`system_role` instead of the role alone.

On SQLite, dropping the role's unique index rebuilds accounts_user (create, copy, drop, rename), which
SQLite refuses while a trigger of migration 0012 names the table: those triggers are dropped first and
created again after (the same statements as 0012). PostgreSQL alters in place.
"""

from importlib import import_module

from django.db import migrations, models

_may_send = import_module("accounts.migrations.0012_ledgeraccount_may_send")


def drop_sqlite_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in _may_send.SQLITE_DROP:
            schema_editor.execute(statement, params=None)


def create_sqlite_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in _may_send.SQLITE:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0012_ledgeraccount_may_send"),
    ]

    operations = [
        migrations.RunPython(drop_sqlite_triggers, create_sqlite_triggers),
        migrations.AddField(
            model_name="user",
            name="system_shard",
            field=models.PositiveSmallIntegerField(
                default=0,
                help_text="A house role may be split over several accounts (shards) so that postings of different "
                "customers do not queue on one lock (accounts/ledger/system.py).",
            ),
        ),
        migrations.AlterField(
            model_name="user",
            name="system_role",
            field=models.CharField(
                blank=True,
                choices=[
                    ("world", "Outside world (chain and fiat rails)"),
                    ("fees", "Fees collected"),
                    ("convert_liquidity", "Conversion liquidity"),
                    ("equity", "Operator adjustments and funding"),
                ],
                help_text="Set only for the service's own ledger accounts.",
                max_length=32,
                null=True,
            ),
        ),
        migrations.AddConstraint(
            model_name="user",
            constraint=models.UniqueConstraint(
                condition=models.Q(("system_role__isnull", False)),
                fields=("system_role", "system_shard"),
                name="one_account_per_system_role_shard",
            ),
        ),
        migrations.RunPython(create_sqlite_triggers, drop_sqlite_triggers),
    ]
