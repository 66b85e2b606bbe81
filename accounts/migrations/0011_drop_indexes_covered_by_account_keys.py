"""Drop the account_id indexes of the journal tables: each table's unique constraint or composite
index already leads with the account (balance: account, asset; balance change: account, seq;
entry: account, asset, posting; limit counter: account, span, period_start, asset), so these only
cost writes (about 6 index entries per transfer).

Django's own AlterField would also drop and re-add each foreign key, re-validating every row of the
journal under a lock that blocks postings; this drops only the indexes, and on PostgreSQL
CONCURRENTLY (so the migration is not atomic)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

INDEXES = {  # Django's names for them, the same on every database
    "accounts_balance": "accounts_balance_account_id_c97b7b48",
    "accounts_balancechange": "accounts_balancechange_account_id_b545b543",
    "accounts_entry": "accounts_entry_account_id_8460c2c7",
    "accounts_limitcounter": "accounts_limitcounter_account_id_bcd167f5",
}


def drop(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    for index in INDEXES.values():
        schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS {schema_editor.quote_name(index)}")


def recreate(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    for table, index in INDEXES.items():
        schema_editor.execute(
            f"CREATE INDEX{concurrently} IF NOT EXISTS {schema_editor.quote_name(index)}"
            f" ON {schema_editor.quote_name(table)} (account_id)"
        )


def _account(related_name):
    return models.ForeignKey(
        db_index=False,
        on_delete=django.db.models.deletion.PROTECT,
        related_name=related_name,
        to=settings.AUTH_USER_MODEL,
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("accounts", "0010_entries_balanced_per_statement"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="balance", name="account", field=_account("balances")),
                migrations.AlterField(model_name="balancechange", name="account", field=_account("+")),
                migrations.AlterField(model_name="entry", name="account", field=_account("+")),
                migrations.AlterField(model_name="limitcounter", name="account", field=_account("+")),
            ],
            database_operations=[migrations.RunPython(drop, recreate)],
        ),
    ]
