"""Security review, issue 12 (2): failures Django answers outside the views (a Host header not in
ALLOWED_HOSTS, other SuspiciousOperations, errors raised in a middleware) are the `{code, msg}`
envelope on every /openapi/ path; the admin keeps Django's HTML pages."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404
from django.test import Client, RequestFactory, override_settings
from django.urls import get_resolver

from exchange.api import handlers
from exchange.api.models import RateLimitBan
from exchange.api.ratelimit import USED_WEIGHT_HEADER
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

EVIL = "evil.example"


def _assert_json(response) -> None:
    assert response["Content-Type"] == "application/json", response["Content-Type"]


@override_settings(DEBUG=False)
@pytest.mark.parametrize(
    "path",
    ["/openapi/v1/ping", "/openapi/v1/api-keys", "/openapi/v1/account", "/openapi/v1/nothing", "/openapi/schema"],
)
def test_a_bad_host_gets_the_json_envelope(client, path):
    response = client.get(path, HTTP_HOST=EVIL)
    body = assert_error(response, -1010, 400)
    _assert_json(response)
    assert EVIL not in body["msg"]


@override_settings(DEBUG=False)
def test_a_signed_request_with_a_bad_host_gets_the_json_envelope(signed_client):
    response = signed_client.get("/openapi/v1/api-keys", headers={"Host": EVIL})
    assert_error(response, -1010, 400)
    _assert_json(response)
    response = signed_client.post("/openapi/v1/userDataStream", headers={"Host": EVIL})
    assert_error(response, -1010, 400)
    assert signed_client.get("/openapi/v1/api-keys").status_code == 200  # with a good Host, served


@override_settings(DEBUG=False)
def test_a_bad_host_is_charged_to_the_ip(client):
    first = client.get("/openapi/v1/ping", HTTP_HOST=EVIL, REMOTE_ADDR="192.0.2.90")
    assert first[USED_WEIGHT_HEADER] == "1"
    second = client.get("/openapi/v1/ping", HTTP_HOST=EVIL, REMOTE_ADDR="192.0.2.90")
    assert second[USED_WEIGHT_HEADER] == "2"
    assert client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.90")[USED_WEIGHT_HEADER] == "3"


@override_settings(DEBUG=False, IP_WEIGHT_LIMIT_PER_MINUTE=2)
def test_a_client_flooding_bad_hosts_meets_its_limit_and_its_ban(client):
    for _ in range(2):
        assert_error(client.get("/openapi/v1/ping", HTTP_HOST=EVIL, REMOTE_ADDR="192.0.2.91"), -1010, 400)
    refused = client.get("/openapi/v1/ping", HTTP_HOST=EVIL, REMOTE_ADDR="192.0.2.91")
    assert_error(refused, -1003, 429)
    assert int(refused["Retry-After"]) > 0
    assert_error(client.get("/openapi/v1/ping", HTTP_HOST=EVIL, REMOTE_ADDR="192.0.2.91"), -1003, 418)
    assert_error(client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.91"), -1003, 418)
    assert RateLimitBan.objects.filter(ip="192.0.2.91").exists()


@override_settings(DEBUG=False)
def test_the_admin_keeps_its_html_400_for_a_bad_host(client):
    response = client.get("/admin/", HTTP_HOST=EVIL)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")


def test_the_url_conf_names_the_handlers():
    resolver = get_resolver()
    assert resolver.resolve_error_handler(400) is handlers.bad_request
    assert resolver.resolve_error_handler(403) is handlers.permission_denied
    assert resolver.resolve_error_handler(404) is handlers.page_not_found
    assert resolver.resolve_error_handler(500) is handlers.server_error


# A middleware that raises what the request asks for: failures that no DRF view can translate.
_RAISED = {
    "suspicious": SuspiciousOperation("crafted"),
    "denied": PermissionDenied("crafted"),
    "missing": Http404("crafted"),
    "fault": RuntimeError("crafted"),
}


class RaisingMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        kind = request.headers.get("X-Raise")
        if kind:
            raise _RAISED[kind]
        return self.get_response(request)


def _with_raising_middleware():
    from django.conf import settings

    return override_settings(DEBUG=False, MIDDLEWARE=[*settings.MIDDLEWARE, f"{__name__}.RaisingMiddleware"])


@pytest.mark.parametrize(
    ("kind", "code", "status"),
    [("suspicious", -1010, 400), ("denied", -1152, 401), ("missing", -1010, 404), ("fault", -1000, 500)],
)
@pytest.mark.parametrize("path", ["/openapi/v1/ping", "/openapi/v1/api-keys", "/openapi/docs"])
def test_failures_outside_the_views_get_the_envelope_on_openapi_paths(kind, code, status, path):
    client = Client(raise_request_exception=False)
    with _with_raising_middleware():
        response = client.get(path, headers={"X-Raise": kind})
    assert_error(response, code, status)
    _assert_json(response)


@pytest.mark.parametrize(("kind", "status"), [("suspicious", 400), ("denied", 403), ("missing", 404), ("fault", 500)])
def test_failures_outside_the_views_keep_djangos_pages_in_the_admin(kind, status):
    client = Client(raise_request_exception=False)
    with _with_raising_middleware():
        response = client.get("/admin/login/", headers={"X-Raise": kind})
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/html")


def test_the_handlers_read_only_the_path():
    """A request refused for its Host must not be asked for its host again."""
    request = RequestFactory().get("/openapi/v1/ping", HTTP_HOST=EVIL)
    for response, code, status in (
        (handlers.bad_request(request, SuspiciousOperation("x")), -1010, 400),
        (handlers.permission_denied(request, PermissionDenied()), -1152, 401),
        (handlers.page_not_found(request, Http404()), -1010, 404),
        (handlers.server_error(request), -1000, 500),
    ):
        assert response.status_code == status
        assert json.loads(response.content)["code"] == code
