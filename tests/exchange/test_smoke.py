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


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("false", False), ("true", True)])
def test_db_health_checks_come_from_the_environment(value, expected):
    """DB_HEALTH_CHECKS (default off) sets Django's per-request connection check on PostgreSQL."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "DB_HEALTH_CHECKS"}
    env.update(DATABASE_URL="postgres://u:p@127.0.0.1:5432/db", DJANGO_SETTINGS_MODULE="exchange.settings.base")
    if value is not None:
        env["DB_HEALTH_CHECKS"] = value
    code = "from exchange.settings import base; print(base.DATABASES['default']['CONN_HEALTH_CHECKS'])"
    out = subprocess.run(  # noqa: S603 - this interpreter, our own arguments
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == str(expected)
