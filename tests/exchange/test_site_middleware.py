"""API paths skip the site middleware (sessions, CSRF, user, messages) and DRF's content negotiation
for plain requests; the admin and the Swagger page keep all of it, and API responses are unchanged.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import User
from exchange.api import ratelimit
from exchange.api.middleware import is_api_path
from exchange.api.models import RateLimitBan
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

PING = "/openapi/v1/ping"
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
CSRF_INPUT = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')


def _assert_api_headers(response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response[name] == value, name
    assert response["Content-Type"] == "application/json"
    assert response["Content-Length"] == str(len(response.content))
    assert "Set-Cookie" not in response.headers
    assert "Vary" not in response.headers
    assert not response.cookies


def test_api_paths_and_browser_pages():
    assert is_api_path("/openapi/v1/ping")
    assert is_api_path("/openapi/transfer/v4/transfers")
    assert is_api_path("/openapi/docs/")  # not the page: the JSON 404
    assert not is_api_path("/openapi/docs")
    assert not is_api_path("/openapi/schema")
    assert not is_api_path("/admin/")
    assert not is_api_path("/openapi")


@pytest.mark.parametrize(
    ("method", "path", "status", "body", "allow"),
    [
        ("get", PING, 200, b"{}", "GET, HEAD"),
        ("post", PING, 405, b'{"code":-1010,"msg":"Method \'POST\' is not allowed on this endpoint."}', "GET, HEAD"),
        ("get", "/openapi/v1/none", 404, b'{"code":-1010,"msg":"Not found: /openapi/v1/none"}', "GET, HEAD, OPTIONS"),
    ],
)
def test_api_responses_keep_their_headers_and_set_no_cookie(method, path, status, body, allow):
    client = Client()
    client.cookies["sessionid"] = "a-stale-session"
    client.cookies["csrftoken"] = "x" * 32
    response = getattr(client, method)(path, REMOTE_ADDR="192.0.2.60")
    assert response.status_code == status
    assert response.content == body
    assert response["Allow"] == allow
    assert response["X-SERVICE-USED-WEIGHT-1M"]
    _assert_api_headers(response)


@pytest.mark.parametrize("accept", [None, "*/*", "application/json", "application/json, text/plain, */*"])
def test_plain_accept_headers_get_compact_json(client, accept):
    headers = {} if accept is None else {"Accept": accept}
    response = client.get("/openapi/v1/time", headers=headers)
    assert response.status_code == 200
    assert re.fullmatch(rb'\{"serverTime":\d+\}', response.content)
    _assert_api_headers(response)


def test_other_accept_headers_are_still_negotiated_by_drf(client):
    assert_error(client.get(PING, headers={"Accept": "text/html"}), -1010, 400)
    assert_error(client.get(PING, headers={"Accept": ""}), -1010, 400)
    indented = client.get("/openapi/v1/check-sys-status", headers={"Accept": "application/json; indent=2"})
    assert indented.status_code == 200
    assert indented.content.startswith(b'[\n  {\n    "businessType"')
    assert_error(client.get(PING, {"format": "xml"}), -1010, 404)
    assert client.get(PING, {"format": "json"}).json() == {}


def test_swagger_page_keeps_the_csrf_cookie(client):
    response = client.get("/openapi/docs")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies


def test_admin_login_needs_the_csrf_token_and_keeps_a_session(client):
    User.objects.create_superuser(email="boss@staff.example", password="pw-for-tests")
    browser = Client(enforce_csrf_checks=True)
    login_url = reverse("admin:login")
    page = browser.get(login_url)
    assert page.status_code == 200
    assert "csrftoken" in page.cookies
    token = CSRF_INPUT.search(page.content).group(1).decode()
    credentials = {"username": "boss@staff.example", "password": "pw-for-tests", "next": "/admin/"}

    refused = browser.post(login_url, credentials)
    assert refused.status_code == 403  # no token: CSRF still guards the admin

    response = browser.post(login_url, {**credentials, "csrfmiddlewaretoken": token})
    assert response.status_code == 302, response.content[:500]
    assert "sessionid" in response.cookies
    index = browser.get("/admin/")
    assert index.status_code == 200
    assert b"boss@staff.example" in index.content

    # Messages: an admin action's confirmation is shown on the next page.
    ban = ratelimit.rate_limit_ban_create(ip="192.0.2.61", reason="test")
    changelist = reverse("admin:exchange_ratelimitban_changelist")
    token = CSRF_INPUT.search(browser.get(changelist).content).group(1).decode()
    done = browser.post(
        changelist,
        {
            "action": "lift_bans",
            "_selected_action": [str(ban.pk)],
            "index": "0",
            "reason": "customer fixed their client",
            "csrfmiddlewaretoken": token,
        },
        follow=True,
    )
    assert done.status_code == 200
    assert b"Lifted 1 ban(s)." in done.content
    assert RateLimitBan.objects.get(pk=ban.pk).lifted_at is not None

    # The session cookie means nothing to the API: it still wants its key.
    assert_error(browser.get("/openapi/v1/api-keys"), -1002, 401)


@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_api_skips_and_the_admin_keeps_the_site_middleware():
    """Daphne serves HTTP through Django's ASGI handler: the middleware runs in async mode there."""
    import asyncio

    from django.test import AsyncClient

    async def both():
        client = AsyncClient()
        return await client.get(PING, REMOTE_ADDR="192.0.2.62"), await client.get(reverse("admin:login"))

    api, login = asyncio.run(both())
    assert api.status_code == 200
    assert api.content == b"{}"
    _assert_api_headers(api)
    assert login.status_code == 200
    assert "csrftoken" in login.cookies
    assert CSRF_INPUT.search(login.content)
