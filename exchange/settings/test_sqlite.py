"""The embedded mode's database (SQLite) under the tests that cover its own code paths: the
ledger's portable write, the limit counters, transfers (`make test` runs them a second time with
these settings). Redis stays as in the PostgreSQL run."""

from .base import VAR_DIR
from .test import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(VAR_DIR / "test-embedded.sqlite3"),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},  # as the embedded mode (base.py)
        "ATOMIC_REQUESTS": False,
        "TEST": {"NAME": str(VAR_DIR / "test-embedded-run.sqlite3")},
    }
}
