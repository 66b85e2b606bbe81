import pytest

from tests.conftest import assert_error


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
