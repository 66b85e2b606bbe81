"""The replica's settings (docs/scaling.md, "Reads of history on replicas"): DATABASE_REPLICA_URL adds
the alias; without it nothing changes. The settings module is read in a fresh interpreter with the
environment under test (settings are read once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exchange.runtime import replicas

_DUMP = """
import json
from exchange.settings import base as s
print(json.dumps({name: getattr(s, name, None) for name in (
    "DATABASES", "REPLICA_MAX_LAG_SECONDS", "REPLICA_STICKY_SECONDS", "REPLICA_CHECK_SECONDS")}, default=str))
"""


def _settings(**env: str) -> dict:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "REPLICA_", "DB_")) and k != "REDIS_URL"
    }
    done = subprocess.run(  # noqa: S603 - this interpreter on our own settings
        [sys.executable, "-c", _DUMP], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_replica_url_there_is_no_replica():
    s = _settings(DATABASE_URL="postgres://u:p@h:5432/db")
    assert list(s["DATABASES"]) == ["default"]


def test_a_multi_host_replica_url_becomes_the_replica_alias():
    url = "postgres://u:p@10.77.0.11:5432,10.77.0.12:5432,10.77.0.13:5432/exchange?target_session_attrs=prefer-standby"
    s = _settings(DATABASE_URL="postgres://u:p@10.77.0.11:5432/exchange", DATABASE_REPLICA_URL=url)
    db = s["DATABASES"]["replica"]
    assert db["HOST"] == "10.77.0.11,10.77.0.12,10.77.0.13"
    assert db["OPTIONS"]["target_session_attrs"] == "prefer-standby"
    assert db["OPTIONS"]["connect_timeout"] == 2  # a cut standby costs a read 2 s, then it is skipped
    # its own pool, the same bounds; a replica away holds a read up to 2 s, not the primary's 5
    assert db["OPTIONS"]["pool"] == s["DATABASES"]["default"]["OPTIONS"]["pool"] | {"timeout": 2.0}
    assert db["ATOMIC_REQUESTS"] is False
    assert db["TEST"] == {"MIRROR": "default"}  # never created or flushed by a test run
    assert (s["REPLICA_MAX_LAG_SECONDS"], s["REPLICA_CHECK_SECONDS"], s["REPLICA_STICKY_SECONDS"]) == (5.0, 1.0, 6.0)


def test_the_sticky_window_is_never_shorter_than_the_lag_bound_and_the_check():
    s = _settings(REPLICA_MAX_LAG_SECONDS="2", REPLICA_STICKY_SECONDS="1")
    assert s["REPLICA_STICKY_SECONDS"] == 3.0
    assert _settings(REPLICA_STICKY_SECONDS="30")["REPLICA_STICKY_SECONDS"] == 30.0


def test_without_a_replica_nothing_is_asked_of_redis(monkeypatch):
    """Not configured: every history read is the primary's, with no Redis command (the statement and
    command counts of the tests without a replica are those of the code before it)."""

    def no_redis():
        pytest.fail("Redis was asked")

    monkeypatch.setattr(replicas, "_sticky_client", no_redis)
    replicas.mark_written([1, 2])
    assert replicas.history_alias([1]) == replicas.PRIMARY
    assert replicas.history_read(lambda alias: alias, account_ids=[1]) == replicas.PRIMARY
