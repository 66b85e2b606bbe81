import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.assertions import assert_error


@pytest.mark.django_db
def test_ping_answers_empty_object(client):
    response = client.get("/openapi/v1/ping")
    assert response.status_code == 200
    assert response.json() == {}
    assert response["X-SERVICE-USED-WEIGHT-1M"] == "1"


@pytest.mark.django_db
def test_signed_api_keys_returns_the_callers_key(signed_client, master_key):
    response = signed_client.get("/openapi/v1/api-keys", {"recvWindow": 5000})
    assert response.status_code == 200, response.content
    assert [item["apiKey"] for item in response.json()] == [master_key[0].key]


@pytest.mark.django_db
def test_bad_signature_refused(signed_client):
    assert_error(signed_client.get("/openapi/v1/api-keys", signature="0" * 64), -1022, 401)


def _run_with_settings(code: str, **environ: str) -> subprocess.CompletedProcess:
    """`python -c code` in a process of its own on exchange.settings.base, with the environment's DB_
    and CONN_ variables replaced by `environ` (DATABASE_URL a placeholder unless given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DB_", "CONN_"))}
    env.update(DATABASE_URL="postgres://u:p@127.0.0.1:5432/db", DJANGO_SETTINGS_MODULE="exchange.settings.base")
    env.update(environ)
    return subprocess.run(  # noqa: S603 - this interpreter, our own arguments
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _database_settings(**environ: str) -> dict:
    """settings.base's DATABASES['default'] for PostgreSQL under the given environment."""
    code = (
        "import json; from exchange.settings import base; d = base.DATABASES['default']; "
        "pool = d.get('OPTIONS', {}).get('pool'); "
        "print(json.dumps({'conn_max_age': d['CONN_MAX_AGE'], 'health': d.get('CONN_HEALTH_CHECKS'), "
        "'pool': pool and {k: (v if not callable(v) else v.__name__) for k, v in pool.items()}}))"
    )
    done = _run_with_settings(code, **environ)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_postgresql_connections_are_pooled_and_bounded_by_default():
    """Each process borrows from a pool of at most DB_POOL_MAX_SIZE connections (docs/operations.md),
    and Django keeps none of its own (CONN_MAX_AGE 0: a request's connection goes back to the pool)."""
    default = _database_settings()
    assert default["conn_max_age"] == 0
    assert default["pool"]["max_size"] == 8
    assert default["pool"]["timeout"] == 5.0
    assert "check" not in default["pool"]
    assert default["health"] is False
    sized = _database_settings(DB_POOL_MAX_SIZE="3", DB_POOL_MIN_SIZE="0", DB_POOL_TIMEOUT="0.5")
    assert (sized["pool"]["max_size"], sized["pool"]["min_size"], sized["pool"]["timeout"]) == (3, 0, 0.5)


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("false", False), ("true", True)])
def test_db_health_checks_come_from_the_environment(value, expected):
    """DB_HEALTH_CHECKS (default off): with the pool, each borrowed connection is checked first;
    without it (DB_POOL=false), Django's per-request connection check."""
    extra = {} if value is None else {"DB_HEALTH_CHECKS": value}
    pooled = _database_settings(**extra)
    assert pooled["health"] is expected  # Django gives the pool its check (ConnectionPool.check_connection)
    assert "check" not in pooled["pool"]
    classic = _database_settings(DB_POOL="false", **extra)
    assert classic["pool"] is None
    assert classic["health"] is expected
    assert classic["conn_max_age"] == 60


@pytest.mark.django_db
def test_a_pooled_connection_with_health_checks_opens_and_checks_each_borrow(settings):
    """With the pool and DB_HEALTH_CHECKS on, a process connects, and its pool checks a connection
    before lending it (a "check" of our own in the pool's options as well failed every connect with
    `ConnectionPool() got multiple values for keyword argument 'check'`)."""
    db = settings.DATABASES["default"]
    code = (
        "import django; django.setup(); from django.db import connection; "
        "from psycopg_pool import ConnectionPool; "
        "cursor = connection.cursor(); cursor.execute('SELECT 41 + 1'); print(cursor.fetchone()[0]); "
        "print(connection.pool._check is ConnectionPool.check_connection)"
    )
    done = _run_with_settings(
        code,
        DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        DB_HEALTH_CHECKS="true",
        DB_POOL_MIN_SIZE="0",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["42", "True"]
