"""A virtual sub-account's name (issue 34): the e-mail its master named it with, shown and looked up
inside its family only, unique per master in any case (subaccounts migration 0004 fills it).

On SQLite, adding a NOT NULL column rebuilds accounts_user, which SQLite refuses while a trigger of
migration 0012 names the table: those triggers are dropped first and created again after (as 0013
does). PostgreSQL alters in place."""

from importlib import import_module

import django.db.models.functions.text
from django.db import migrations, models

_shards = import_module("accounts.migrations.0013_system_role_shards")


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0016_s42d_revocation_log"),
    ]

    operations = [
        migrations.RunPython(_shards.drop_sqlite_triggers, _shards.create_sqlite_triggers),
        migrations.AddField(
            model_name="user",
            name="requested_email",
            field=models.EmailField(
                blank=True,
                default="",
                help_text="A virtual sub-account: the e-mail its master named it with (accountName). Shown and "
                "looked up only inside its family; never a login or a transfer address.",
                max_length=254,
            ),
        ),
        migrations.AddConstraint(
            model_name="user",
            constraint=models.UniqueConstraint(
                django.db.models.functions.text.Lower("requested_email"),
                models.F("master"),
                condition=models.Q(("requested_email", ""), _negated=True),
                name="requested_email_once_per_master",
            ),
        ),
        migrations.RunPython(_shards.create_sqlite_triggers, _shards.drop_sqlite_triggers),
    ]
