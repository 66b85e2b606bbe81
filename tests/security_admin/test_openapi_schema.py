"""Security review, issue 12 (3): /openapi/schema is generated once per process and charged to the
caller's IP like any other request (429 -1003 over the limit, 418 when banned)."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from drf_spectacular.settings import spectacular_settings

from exchange.api import ratelimit
from exchange.api.ratelimit import USED_WEIGHT_HEADER
from exchange.api.schema import forget_openapi_document
from exchange.platform.apis import OpenApiSchemaApi
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

SCHEMA = "/openapi/schema"
JSON_ACCEPT = {"Accept": "application/vnd.oai.openapi+json"}


@pytest.fixture
def generations(monkeypatch) -> list[int]:
    """Counts the generator's runs, starting from a process that has not generated the document yet."""
    forget_openapi_document()
    calls: list[int] = []
    generator_class = spectacular_settings.DEFAULT_GENERATOR_CLASS
    original = generator_class.get_schema

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(generator_class, "get_schema", counted)
    yield calls
    forget_openapi_document()


def test_the_document_is_generated_once_for_many_calls(client, generations):
    yaml_bodies = {client.get(SCHEMA, REMOTE_ADDR="192.0.2.80").content for _ in range(3)}
    json_bodies = {client.get(SCHEMA, {"format": "json"}, REMOTE_ADDR="192.0.2.80").content for _ in range(3)}
    json_bodies.add(client.get(SCHEMA, headers=JSON_ACCEPT, REMOTE_ADDR="192.0.2.80").content)
    assert client.get("/openapi/docs").status_code == 200
    assert client.head(SCHEMA, REMOTE_ADDR="192.0.2.80").status_code == 200
    assert len(generations) == 1
    assert len(yaml_bodies) == 1
    assert len(json_bodies) == 1
    (yaml_body,) = yaml_bodies
    assert yaml_body.startswith(b"openapi: 3")
    (json_body,) = json_bodies
    assert "/openapi/v1/ping" in json.loads(json_body)["paths"]


def test_the_document_keeps_its_media_types(client):
    response = client.get(SCHEMA)
    assert response["Content-Type"] == "application/vnd.oai.openapi; charset=utf-8"
    assert response["Content-Disposition"] == f'inline; filename="{spectacular_settings.TITLE}.yaml"'
    assert client.get(SCHEMA, headers=JSON_ACCEPT)["Content-Type"] == "application/vnd.oai.openapi+json"
    assert client.get(SCHEMA, headers={"Accept": "application/json"})["Content-Type"] == "application/json"


def test_each_call_is_charged_to_the_ip(client):
    weight = OpenApiSchemaApi.ip_weight
    assert weight >= 5
    first = client.get(SCHEMA, REMOTE_ADDR="192.0.2.81")
    assert first[USED_WEIGHT_HEADER] == str(weight)
    second = client.get(SCHEMA, {"format": "json"}, REMOTE_ADDR="192.0.2.81")
    assert second[USED_WEIGHT_HEADER] == str(2 * weight)
    # The IP's other requests see the same counter.
    assert client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.81")[USED_WEIGHT_HEADER] == str(2 * weight + 1)


@override_settings(IP_WEIGHT_LIMIT_PER_MINUTE=2 * OpenApiSchemaApi.ip_weight)
def test_a_client_over_its_ip_limit_gets_429_then_a_ban(client):
    ip = "192.0.2.82"
    assert client.get(SCHEMA, REMOTE_ADDR=ip).status_code == 200
    assert client.get(SCHEMA, REMOTE_ADDR=ip).status_code == 200
    refused = client.get(SCHEMA, REMOTE_ADDR=ip)
    assert_error(refused, -1003, 429)
    assert refused["Content-Type"] == "application/json"  # the envelope, not a YAML rendering of it
    assert int(refused["Retry-After"]) > 0
    banned = client.get(SCHEMA, {"format": "json"}, REMOTE_ADDR=ip)
    assert_error(banned, -1003, 418)
    assert banned["Content-Type"] == "application/json"
    assert client.get(SCHEMA, REMOTE_ADDR="192.0.2.83").status_code == 200  # another address is served


def test_a_banned_ip_gets_418(client):
    ratelimit.rate_limit_ban_create(ip="192.0.2.84", reason="test")
    response = client.get(SCHEMA, REMOTE_ADDR="192.0.2.84")
    assert_error(response, -1003, 418)
    assert response["Content-Type"] == "application/json"


def test_other_refusals_of_the_schema_are_json(client):
    response = client.post(SCHEMA)
    assert_error(response, -1010, 405)
    assert response["Content-Type"] == "application/json"
    response = client.get(SCHEMA, headers={"Accept": "text/html"})
    assert_error(response, -1010, 400)
    assert response["Content-Type"] == "application/json"


def test_the_swagger_page_loads_the_charged_schema(client):
    page = client.get("/openapi/docs")
    assert page.status_code == 200
    assert b"/openapi/schema" in page.content
