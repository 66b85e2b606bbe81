"""The ledger row carries whether its account may send money (accounts/policy.py: active, not
frozen, may withdraw, not a system account), kept by the database from accounts_user:

- a BEFORE INSERT trigger fills it for a new ledger row from its user;
- an AFTER UPDATE trigger on accounts_user copies every change of the four columns, whatever wrote
  them (the admin, a service, a raw UPDATE).

The copy is an UPDATE of the ledger row, so it takes that row's lock: a freeze waits for a posting
of the account in progress, and a posting that locks the row after the freeze committed reads the
new value in its lock statement (accounts/ledger/posting/), with no extra round trip. A posting
names the accounts that must be allowed to send (`post(senders=...)`).
"""

from django.db import migrations, models

MAY_SEND_PG = "(u.is_active AND NOT u.is_frozen AND u.can_withdraw AND u.system_role IS NULL)"
MAY_SEND_NEW_PG = "(NEW.is_active AND NOT NEW.is_frozen AND NEW.can_withdraw AND NEW.system_role IS NULL)"

POSTGRES = f"""
UPDATE accounts_ledgeraccount la SET may_send = {MAY_SEND_PG}
  FROM accounts_user u WHERE u.id = la.user_id;

CREATE OR REPLACE FUNCTION ledger_account_may_send_fill() RETURNS trigger AS $$
BEGIN
  SELECT {MAY_SEND_PG} INTO NEW.may_send FROM accounts_user u WHERE u.id = NEW.user_id;
  RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledgeraccount_may_send_fill BEFORE INSERT ON accounts_ledgeraccount
  FOR EACH ROW EXECUTE FUNCTION ledger_account_may_send_fill();

CREATE OR REPLACE FUNCTION ledger_account_may_send_copy() RETURNS trigger AS $$
BEGIN
  UPDATE accounts_ledgeraccount SET may_send = {MAY_SEND_NEW_PG}
    WHERE user_id = NEW.id AND may_send IS DISTINCT FROM {MAY_SEND_NEW_PG};
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER user_may_send_copy
  AFTER UPDATE OF is_active, is_frozen, can_withdraw, system_role ON accounts_user
  FOR EACH ROW EXECUTE FUNCTION ledger_account_may_send_copy();
"""

POSTGRES_DROP = """
DROP TRIGGER IF EXISTS user_may_send_copy ON accounts_user;
DROP TRIGGER IF EXISTS ledgeraccount_may_send_fill ON accounts_ledgeraccount;
DROP FUNCTION IF EXISTS ledger_account_may_send_copy();
DROP FUNCTION IF EXISTS ledger_account_may_send_fill();
"""

MAY_SEND_SQLITE = "(u.is_active AND NOT u.is_frozen AND u.can_withdraw AND u.system_role IS NULL)"

SQLITE = [
    f"""UPDATE accounts_ledgeraccount SET may_send = (SELECT {MAY_SEND_SQLITE} FROM accounts_user u
          WHERE u.id = accounts_ledgeraccount.user_id)""",
    f"""CREATE TRIGGER ledgeraccount_may_send_fill AFTER INSERT ON accounts_ledgeraccount
        BEGIN
          UPDATE accounts_ledgeraccount SET may_send = (SELECT {MAY_SEND_SQLITE} FROM accounts_user u
            WHERE u.id = NEW.user_id) WHERE user_id = NEW.user_id;
        END""",
    """CREATE TRIGGER user_may_send_copy
        AFTER UPDATE OF is_active, is_frozen, can_withdraw, system_role ON accounts_user
        BEGIN
          UPDATE accounts_ledgeraccount
            SET may_send = (NEW.is_active AND NOT NEW.is_frozen AND NEW.can_withdraw AND NEW.system_role IS NULL)
            WHERE user_id = NEW.id;
        END""",
]

SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS user_may_send_copy",
    "DROP TRIGGER IF EXISTS ledgeraccount_may_send_fill",
]


def apply(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES, params=None)
    else:
        for statement in SQLITE:
            schema_editor.execute(statement, params=None)


def revert(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_DROP, params=None)
    else:
        for statement in SQLITE_DROP:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0011_drop_indexes_covered_by_account_keys")]

    operations = [
        migrations.AddField(
            model_name="ledgeraccount",
            name="may_send",
            field=models.BooleanField(
                default=True,
                db_default=True,  # also for raw INSERTs (ledger._open_ledger_accounts)
                editable=False,
                help_text="Kept by the database from the account (active, not frozen, may withdraw, not a system "
                "account): read under the posting's lock, so a freeze stops every later movement out.",
            ),
        ),
        migrations.RunPython(apply, revert),
    ]
