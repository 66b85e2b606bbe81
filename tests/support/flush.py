"""A transactional test's flush at a third of its cost (tests only; tests/README.md, "Isolation").

pytest-django ends each transactional test with Django's `flush`: one TRUNCATE of every table (about
0.4 s on PostgreSQL, most of them empty), then post_migrate, which re-creates every content type and
permission and the seed's system accounts. Here the TRUNCATE names only the tables that hold rows
(one EXISTS probe each, in one statement; CASCADE takes the tables that refer to them) and leaves
content types and permissions, which every test database has from its migrate and no test changes;
post_migrate then finds them and re-creates only the seed. The database ends as Django's flush
leaves it."""

from __future__ import annotations

from django.db.backends.postgresql.operations import DatabaseOperations

KEPT = ("django_content_type", "auth_permission")
_original = DatabaseOperations.sql_flush


def _sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    tables = [table for table in tables if table not in KEPT]
    if reset_sequences or not tables:
        return _original(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    quote = self.quote_name
    with self.connection.cursor() as cursor:
        # Django's own table names, quoted
        probes = ", ".join(f"EXISTS (SELECT 1 FROM {quote(table)})" for table in tables)  # noqa: S608
        cursor.execute(f"SELECT {probes}")
        holding = [table for table, rows in zip(tables, cursor.fetchone(), strict=True) if rows]
    return _original(self, style, holding, reset_sequences=False, allow_cascade=True)


def install() -> None:
    DatabaseOperations.sql_flush = _sql_flush
