"""General endpoints (ping, time, check-sys-status, user/ip), the caller's IP behind proxies, the
error envelope of unknown paths and methods, and the OpenAPI document."""

from __future__ import annotations

import json
import time

import pytest
from django.test import override_settings

from exchange.platform import services
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

STATUS = "/openapi/v1/check-sys-status"
USER_IP = "/openapi/v1/user/ip"
PROXY = "10.1.2.3"


def test_ping_returns_an_empty_object(client):
    response = client.get("/openapi/v1/ping")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {}


def test_time_returns_the_server_time_in_ms(client):
    before = int(time.time() * 1000)
    response = client.get("/openapi/v1/time")
    after = int(time.time() * 1000)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"serverTime"}
    assert type(body["serverTime"]) is int
    assert before - 2000 <= body["serverTime"] <= after + 2000


# --- the caller's IP -----------------------------------------------------------------------------


def test_user_ip_returns_remote_addr(client):
    response = client.get(USER_IP, REMOTE_ADDR="198.51.100.77")
    assert response.status_code == 200
    assert response.json() == {"ip": "198.51.100.77"}


def test_user_ip_ignores_forwarded_for_without_trusted_proxies(client):
    response = client.get(USER_IP, REMOTE_ADDR=PROXY, headers={"X-Forwarded-For": "203.0.113.9"})
    assert response.json() == {"ip": PROXY}


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_user_ip_behind_a_trusted_proxy_is_the_right_most_untrusted_hop(client):
    response = client.get(USER_IP, REMOTE_ADDR=PROXY, headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.9"})
    assert response.json() == {"ip": "203.0.113.9"}


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_user_ip_skips_a_chain_of_trusted_proxies(client):
    response = client.get(
        USER_IP, REMOTE_ADDR=PROXY, headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.9, 10.20.30.40"}
    )
    assert response.json() == {"ip": "203.0.113.9"}


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_forwarded_for_from_an_untrusted_peer_is_ignored(client):
    response = client.get(USER_IP, REMOTE_ADDR="192.0.2.50", headers={"X-Forwarded-For": "203.0.113.9, 198.51.100.1"})
    assert response.json() == {"ip": "192.0.2.50"}


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_a_forged_left_most_hop_is_not_believed(client):
    # The client 203.0.113.50 sent "X-Forwarded-For: 1.2.3.4, 10.9.9.9" itself; the proxy appended it.
    response = client.get(USER_IP, REMOTE_ADDR=PROXY, headers={"X-Forwarded-For": "1.2.3.4, 10.9.9.9, 203.0.113.50"})
    assert response.json() == {"ip": "203.0.113.50"}


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_a_malformed_forwarded_chain_falls_back_to_the_peer(client):
    response = client.get(USER_IP, REMOTE_ADDR=PROXY, headers={"X-Forwarded-For": "203.0.113.9, not-an-ip"})
    assert response.json() == {"ip": PROXY}


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"], IP_WEIGHT_LIMIT_PER_MINUTE=1)
def test_clients_behind_one_proxy_are_limited_separately(client):
    first = {"REMOTE_ADDR": PROXY, "headers": {"X-Forwarded-For": "203.0.113.1"}}
    second = {"REMOTE_ADDR": PROXY, "headers": {"X-Forwarded-For": "203.0.113.2"}}
    assert client.get("/openapi/v1/ping", **first).status_code == 200
    assert_error(client.get("/openapi/v1/ping", **first), -1003, 429)
    response = client.get("/openapi/v1/ping", **second)
    assert response.status_code == 200
    assert response["X-SERVICE-USED-WEIGHT-1M"] == "1"


# --- check-sys-status ----------------------------------------------------------------------------


def test_check_sys_status_is_on_by_default(client):
    response = client.get(STATUS)
    assert response.status_code == 200
    assert response.json() == [
        {"businessType": "SPOT", "businessStatus": "on"},
        {"businessType": "CONVERT", "businessStatus": "on"},
    ]


def test_check_sys_status_shows_a_business_switched_off(client):
    services.business_status_set(business_type="CONVERT", is_on=False)
    assert client.get(STATUS).json() == [
        {"businessType": "SPOT", "businessStatus": "on"},
        {"businessType": "CONVERT", "businessStatus": "off"},
    ]
    services.business_status_set(business_type="CONVERT", is_on=True)
    assert client.get(STATUS, {"businessType": "CONVERT"}).json() == [
        {"businessType": "CONVERT", "businessStatus": "on"}
    ]


@pytest.mark.parametrize(("business_type", "status"), [("SPOT", "off"), ("CONVERT", "on")])
def test_check_sys_status_filters_by_business_type(client, business_type, status):
    services.business_status_set(business_type="SPOT", is_on=False)
    response = client.get(STATUS, {"businessType": business_type})
    assert response.status_code == 200
    assert response.json() == [{"businessType": business_type, "businessStatus": status}]


@pytest.mark.parametrize("value", ["FUTURES", "spot"])
def test_check_sys_status_refuses_an_unknown_business_type(client, value):
    assert_error(client.get(STATUS, {"businessType": value}), -1025, 400)


# --- errors of the gateway -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/openapi/v1/nothing", "/openapi/v9/ping", "/openapi/"])
def test_unknown_path_is_a_json_404(client, path):
    assert_error(client.get(path), -1010, 404)


@pytest.mark.parametrize("method", ["post", "put", "delete", "patch"])
def test_wrong_method_is_a_json_405(client, method):
    assert_error(getattr(client, method)("/openapi/v1/time"), -1010, 405)


# --- OpenAPI -------------------------------------------------------------------------------------


def _schema(client, **kwargs) -> dict:
    response = client.get("/openapi/schema", **kwargs)
    assert response.status_code == 200, response.content[:300]
    return json.loads(response.content)


@pytest.fixture
def schema(client) -> dict:
    return _schema(client, query_params={"format": "json"})


def test_schema_is_also_served_for_the_openapi_json_media_type(client):
    document = _schema(client, headers={"Accept": "application/vnd.oai.openapi+json"})
    assert "/openapi/v1/ping" in document["paths"]


def test_schema_default_rendering_is_served(client):
    response = client.get("/openapi/schema")
    assert response.status_code == 200
    assert b"/openapi/v1/api-keys" in response.content


@pytest.mark.parametrize(
    "path",
    [
        "/openapi/v1/ping",
        "/openapi/v1/time",
        "/openapi/v1/check-sys-status",
        "/openapi/v1/user/ip",
        "/openapi/v1/api-keys",
    ],
)
def test_schema_lists_the_endpoint(schema, path):
    assert "get" in schema["paths"][path]


def test_schema_has_no_catch_all_or_non_endpoint_paths(schema):
    paths = list(schema["paths"])
    assert all(path.startswith("/openapi/") for path in paths), paths
    assert not {"/openapi/schema", "/openapi/docs"} & set(paths), paths
    assert not any("{" in path and not path.endswith("{transfer_id}") for path in paths), paths


def test_schema_declares_signing_parameters_and_key_security_of_api_keys(schema):
    operation = schema["paths"]["/openapi/v1/api-keys"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert {"timestamp", "signature", "recvWindow"} <= set(params)
    assert params["timestamp"]["required"] is True
    assert params["signature"]["required"] is True
    assert operation["security"] == [{"ApiKey": []}]
    scheme = schema["components"]["securitySchemes"]["ApiKey"]
    assert scheme == {"type": "apiKey", "in": "header", "name": "X-SERVICE-APIKEY"}


def test_schema_of_an_open_endpoint_has_no_signing_parameters(schema):
    operation = schema["paths"]["/openapi/v1/check-sys-status"]["get"]
    names = [p["name"] for p in operation.get("parameters", [])]
    assert names == ["businessType"]
    assert {"ApiKey": []} not in operation.get("security", [])


def test_openapi_docs_page_is_html(client):
    response = client.get("/openapi/docs")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"swagger" in response.content.lower()
