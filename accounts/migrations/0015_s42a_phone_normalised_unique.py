"""Phone numbers unique compared normalised (accounts/phones.py; issue 34, finding 1).

Before the constraint is added, every stored number is rewritten in its normalised form (spaces,
dashes and brackets removed). Where several accounts' numbers are the same once normalised, the
number stays with the one account a transfer to it reached until now (the account whose stored
value was already the normalised, E.164 form: transfers only looked numbers up exactly as sent),
or else with the oldest account; the others' numbers are cleared (NULL), never reassigned, and the
ids of those accounts are printed by `migrate` so that operators can ask their owners
(docs/operations.md, "Identifiers and ownership"). On PostgreSQL and SQLite alike the constraint is
a unique index on an expression: SQLite does not rebuild accounts_user for it.
"""

from collections import defaultdict

import django.db.models.functions.text
from django.db import migrations, models

SEPARATORS = (" ", "-", "(", ")")  # accounts/phones.py, frozen here as this migration applies it


def _normalised(raw):
    value = raw
    for separator in SEPARATORS:
        value = value.replace(separator, "")
    return value or None


def normalise_phones(apps, schema_editor):
    User = apps.get_model("accounts", "User")
    by_number = defaultdict(list)
    for pk, phone in User.objects.filter(phone__isnull=False).order_by("id").values_list("id", "phone"):
        by_number[_normalised(phone)].append((pk, phone))
    cleared = []
    for number, holders in by_number.items():
        if number is None:
            User.objects.filter(pk__in=[pk for pk, _ in holders]).update(phone=None)
            continue
        keeper = next((pk for pk, phone in holders if phone == number), holders[0][0])
        others = [pk for pk, _ in holders if pk != keeper]
        if others:
            User.objects.filter(pk__in=others).update(phone=None)
            cleared.extend(others)
        if next(phone for pk, phone in holders if pk == keeper) != number:
            User.objects.filter(pk=keeper).update(phone=number)
    if cleared:
        print(  # noqa: T201 - what migrate did to customers' data is said where it is run
            f"\n  accounts 0015: phone number cleared on account(s) {', '.join(map(str, sorted(cleared)))}: "
            "another account holds the same number (normalised)."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0014_adjustment_four_eyes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="user",
            name="phone",
            field=models.CharField(
                blank=True,
                help_text="E.164, e.g. +639171234567; used as a transfer address. Unique compared normalised "
                "(spaces, dashes and brackets ignored: accounts/phones.py).",
                max_length=32,
                null=True,
                unique=True,
            ),
        ),
        migrations.RunPython(normalise_phones, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="user",
            constraint=models.UniqueConstraint(
                django.db.models.functions.text.Replace(
                    django.db.models.functions.text.Replace(
                        django.db.models.functions.text.Replace(
                            django.db.models.functions.text.Replace(
                                models.F("phone"), models.Value(" "), models.Value("")
                            ),
                            models.Value("-"),
                            models.Value(""),
                        ),
                        models.Value("("),
                        models.Value(""),
                    ),
                    models.Value(")"),
                    models.Value(""),
                ),
                name="user_phone_normalised_unique",
            ),
        ),
    ]
