"""Rules the database enforces on PostgreSQL whatever code writes to it:
- every posting's entries sum to zero per asset, checked at commit (deferred constraint trigger);
- postings, entries and change-feed amounts are append-only (no UPDATE or DELETE; the change feed
  may only be marked published).
SQLite (the embedded default) has no deferred triggers; `manage.py ledger_check` covers it there.
"""

from django.db import migrations

# The zero-sum rule as first written (migration 0010 replaced it, and restores it when reversed).
ZERO_SUM_RULE = """
CREATE OR REPLACE FUNCTION ledger_posting_sums_to_zero() RETURNS trigger AS $$
BEGIN
  IF EXISTS (
    SELECT 1 FROM accounts_entry WHERE posting_id = NEW.posting_id
    GROUP BY asset_id HAVING SUM(side * amount) <> 0
  ) THEN
    RAISE EXCEPTION 'ledger: posting % does not sum to zero per asset', NEW.posting_id
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE CONSTRAINT TRIGGER entry_posting_sums_to_zero
  AFTER INSERT ON accounts_entry DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION ledger_posting_sums_to_zero();
"""

POSTGRES_RULES = ZERO_SUM_RULE + """
CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'ledger: % is append-only (% refused)', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER entry_append_only BEFORE UPDATE OR DELETE ON accounts_entry
  FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER posting_append_only BEFORE UPDATE OR DELETE ON accounts_posting
  FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE FUNCTION ledger_change_feed_frozen() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'DELETE' OR ROW(NEW.account_id, NEW.asset_id, NEW.posting_id, NEW.kind, NEW.seq, NEW.delta_free,
      NEW.delta_locked, NEW.free_after, NEW.locked_after, NEW.created_at)
      IS DISTINCT FROM ROW(OLD.account_id, OLD.asset_id, OLD.posting_id, OLD.kind, OLD.seq, OLD.delta_free,
      OLD.delta_locked, OLD.free_after, OLD.locked_after, OLD.created_at) THEN
    RAISE EXCEPTION 'ledger: the change feed only records publication (% refused)', TG_OP
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER balancechange_frozen BEFORE UPDATE OR DELETE ON accounts_balancechange
  FOR EACH ROW EXECUTE FUNCTION ledger_change_feed_frozen();
"""

POSTGRES_DROP = """
DROP TRIGGER IF EXISTS balancechange_frozen ON accounts_balancechange;
DROP TRIGGER IF EXISTS posting_append_only ON accounts_posting;
DROP TRIGGER IF EXISTS entry_append_only ON accounts_entry;
DROP TRIGGER IF EXISTS entry_posting_sums_to_zero ON accounts_entry;
DROP FUNCTION IF EXISTS ledger_change_feed_frozen();
DROP FUNCTION IF EXISTS ledger_append_only();
DROP FUNCTION IF EXISTS ledger_posting_sums_to_zero();
"""


def apply(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_RULES, params=None)  # no parameters: RAISE's % stays literal


def revert(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_ledger")]

    operations = [migrations.RunPython(apply, revert)]
