"""The only skips a test run may have. tests/conftest.py turns every other skip into a failure: a
test that did not run has proved nothing, and `make test` must not pass because PostgreSQL, Redis,
a browser or a server binary was missing (the tests that need them fail with the reason instead,
tests/support/stack.py).

The expected skips are the PostgreSQL-only tests when the run's database is SQLite (`make test`
runs the embedded mode's own SQL on SQLite, Makefile EMBEDDED_TESTS). On PostgreSQL no skip at all
is expected. Add a reason here only with the tests that use it, and say why it cannot run.
"""

from __future__ import annotations

# reason given to pytest.skip / skipif -> why the test cannot run on SQLite
POSTGRESQL_ONLY = {
    "SQLite locks the whole database": "tests/ledger/test_house_shards.py: shards that do not wait for each other",
    "SQLite does not enforce VARCHAR lengths": "tests/ledger/test_posting.py: a linked row the database refuses",
    "PostgreSQL's catalog": "tests/ledger/test_database_rules.py: the journal's indexes",
    "moves a PostgreSQL sequence": "tests/wallet/test_transfers.py: transfer ids past 2**31",
    "PostgreSQL's plans": "tests/wallet/test_open_indexes.py: the plans of the open-work queries",
    "PostgreSQL prepared statements": "tests/ledger/test_prepared.py",
}


def skip_reason(report) -> str | None:
    """The reason of a skipped test or collector report (None when it did not skip, or was an xfail)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def unexpected(reason: str, vendor: str) -> str | None:
    """Why a skip with `reason` fails a run on a `vendor` database, or None when it is expected."""
    if vendor != "postgresql" and reason in POSTGRESQL_ONLY:
        return None
    return (
        f"unexpected skip ({reason}): a run may skip only the PostgreSQL-only tests on SQLite "
        "(tests/support/skips.py lists them); whatever this test needs is missing, so it proved nothing"
    )


def fail_if_unexpected(report, vendor: str) -> None:
    """Turn `report` (a test phase's or a collector's) into a failure when it is an unexpected skip."""
    reason = skip_reason(report)
    if reason is None:
        return
    why = unexpected(reason, vendor)
    if why is not None:
        report.outcome = "failed"
        report.longrepr = why
