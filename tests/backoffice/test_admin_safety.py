"""The admin's safety: staff sessions expire (8 h, and at browser close), ADMIN_HOSTS keeps the admin
off the public API's hosts, CSRF is enforced, failed logins are rate limited per IP and per
username, every admin action needs a reason and is audited, and an API secret is shown on its
creation page only."""

from __future__ import annotations

import re

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse

from accounts.models import ApiKey
from exchange.backoffice.models import StaffAction
from exchange.platform.models import BusinessStatus
from tests.support.backoffice import awaiting_withdrawal, usdt_customer
from tests.support.factories import TEST_PASSWORD, ApiKeyFactory, UserFactory
from tests.support.staff import ADMINISTRATOR, TREASURY, logged_in, staff_member
from wallet.models import WithdrawalStage

pytestmark = pytest.mark.django_db
LOGIN = "/admin/login/"


def _login(client: Client, username: str, password: str, **extra):
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"}, **extra)


# --- sessions ------------------------------------------------------------------------------------


def test_a_staff_session_lasts_eight_hours_and_ends_with_the_browser():
    assert django_settings.SESSION_COOKIE_AGE == 8 * 3600
    assert django_settings.SESSION_EXPIRE_AT_BROWSER_CLOSE is True
    member = staff_member(ADMINISTRATOR)
    client = Client()
    response = _login(client, member.email, TEST_PASSWORD)
    assert response.status_code == 302
    cookie = response.cookies[django_settings.SESSION_COOKIE_NAME]
    assert not cookie["expires"]  # a browser-session cookie: gone when the browser closes
    assert not cookie["max-age"]
    assert cookie["httponly"]
    assert client.session.get_expiry_age() == 8 * 3600  # and the server forgets it after 8 hours


# --- ADMIN_HOSTS ---------------------------------------------------------------------------------


def test_admin_hosts_serve_the_admin_and_other_hosts_answer_404(settings):
    settings.ALLOWED_HOSTS = ["api.example.test", "ops.example.test", "testserver"]
    settings.ADMIN_HOSTS = ["ops.example.test"]
    client = logged_in(staff_member(ADMINISTRATOR))
    assert client.get("/admin/", HTTP_HOST="ops.example.test").status_code == 200
    assert client.get("/admin/", HTTP_HOST="ops.example.test:8443").status_code == 200
    for host in ("api.example.test", "testserver"):
        assert client.get("/admin/", HTTP_HOST=host).status_code == 404, host
        assert client.get(LOGIN, HTTP_HOST=host).status_code == 404, host
        assert client.post(LOGIN, {"username": "x", "password": "y"}, HTTP_HOST=host).status_code == 404, host
    # The API still answers on its host.
    assert Client().get("/openapi/v1/ping", HTTP_HOST="api.example.test").status_code == 200


def test_without_admin_hosts_the_admin_answers_on_every_allowed_host(settings):
    settings.ADMIN_HOSTS = []
    assert Client().get(LOGIN).status_code == 200


# --- CSRF ----------------------------------------------------------------------------------------


def test_admin_posts_without_the_csrf_token_are_refused():
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_member(TREASURY))
    response = client.post(
        reverse("admin:wallet_withdrawal_changelist"),
        {"action": "approve", "_selected_action": [str(withdrawal.pk)], "index": "0", "reason": "r"},
    )
    assert response.status_code == 403
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert "django.middleware.csrf.CsrfViewMiddleware" not in django_settings.MIDDLEWARE  # the site-only subclass
    assert "exchange.api.middleware.CsrfViewMiddleware" in django_settings.MIDDLEWARE


# --- login throttling ----------------------------------------------------------------------------


def test_failed_logins_are_limited_per_username(settings):
    settings.ADMIN_LOGIN_FAILURES_PER_USERNAME = 3
    member = staff_member(ADMINISTRATOR)
    for attempt in range(3):
        response = _login(Client(), member.email, "wrong", REMOTE_ADDR=f"198.51.100.{attempt + 1}")
        assert response.status_code == 200
        assert b"Too many failed logins" not in response.content
    # The fourth attempt, from yet another address and with the right password, is refused.
    refused = _login(Client(), member.email, TEST_PASSWORD, REMOTE_ADDR="198.51.100.9")
    assert refused.status_code == 200
    assert b"Too many failed logins" in refused.content
    # Another account is not affected.
    other = staff_member(ADMINISTRATOR)
    assert _login(Client(), other.email, TEST_PASSWORD, REMOTE_ADDR="198.51.100.9").status_code == 302


def test_failed_logins_are_limited_per_ip(settings):
    settings.ADMIN_LOGIN_FAILURES_PER_IP = 4
    for attempt in range(4):
        _login(Client(), f"nobody{attempt}@test.example", "wrong", REMOTE_ADDR="203.0.113.5")
    member = staff_member(ADMINISTRATOR)
    refused = _login(Client(), member.email, TEST_PASSWORD, REMOTE_ADDR="203.0.113.5")
    assert b"Too many failed logins" in refused.content
    assert _login(Client(), member.email, TEST_PASSWORD, REMOTE_ADDR="203.0.113.6").status_code == 302


# --- reasons and the audit trail -----------------------------------------------------------------


def test_an_action_without_a_reason_is_refused_and_changes_nothing(django_capture_on_commit_callbacks):
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    client = logged_in(staff_member(TREASURY))
    url = reverse("admin:wallet_withdrawal_changelist")
    response = client.post(
        url, {"action": "approve", "_selected_action": [str(withdrawal.pk)], "index": "0", "reason": ""}, follow=True
    )
    assert any("reason is required" in str(m) for m in response.context["messages"])
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert not StaffAction.objects.exists()


def test_business_status_needs_a_reason_and_is_audited():
    admin = staff_member(ADMINISTRATOR)
    client = logged_in(admin)
    row = BusinessStatus.objects.get(business_type="CONVERT")
    url = reverse("admin:exchange_businessstatus_change", args=[row.pk])
    assert client.post(url, {"_save": "Save"}).status_code == 200  # the form again: reason missing
    row.refresh_from_db()
    assert row.is_on is True
    assert client.post(url, {"reason": "liquidity provider down", "_save": "Save"}).status_code == 302
    row.refresh_from_db()
    assert row.is_on is False
    record = StaffAction.objects.get()
    assert (record.actor, record.action, record.reason) == (admin, "business_status.set", "liquidity provider down")
    assert (record.before["is_on"], record.after["is_on"]) == (True, False)


# --- API secrets ---------------------------------------------------------------------------------


def test_the_secret_is_shown_on_the_creation_page_only():
    admin = staff_member(ADMINISTRATOR)
    client = logged_in(admin)
    alice = UserFactory()
    created = client.post(
        reverse("admin:accounts_apikey_add"),
        {"user": alice.pk, "name": "once", "ip_list": "", "reason": "customer request", "_save": "Save"},
    )
    assert created.status_code == 200
    assert "no-store" in created["Cache-Control"]
    secret = re.search(r'<code id="secret-key">([A-Za-z0-9]+)</code>', created.content.decode()).group(1)
    api_key = ApiKey.objects.get(name="once")
    ApiKeyFactory(user=alice, name="another")

    # Every page that shows the key, its owner or its creation, rendered for an Administrator (200,
    # and showing what proves it is that page: a refusal would hold no secret by accident).
    creation = StaffAction.objects.get(action="api_key.create")
    pages = {
        reverse("admin:accounts_apikey_changelist"): f"{api_key.key[:12]}…",
        reverse("admin:accounts_apikey_changelist") + f"?q={api_key.key}": f"{api_key.key[:12]}…",
        reverse("admin:accounts_apikey_change", args=[api_key.pk]): f"once ({api_key.key[:8]}…)",
        reverse("admin:accounts_apikey_history", args=[api_key.pk]): "once",
        reverse("admin:accounts_user_change", args=[alice.pk]): alice.email,
        reverse("admin:exchange_staffaction_changelist"): "api_key.create",
        reverse("admin:exchange_staffaction_change", args=[creation.pk]): api_key.key,
        reverse("admin:index"): "<title>Operations dashboard",
    }
    for url, shown in pages.items():
        response = client.get(url)
        page = response.content.decode()
        assert response.status_code == 200, (url, response.status_code)
        assert shown in page, (url, shown)
        assert secret not in page, url
    # A key is never deleted (disabled instead): its delete page is refused, secret or not.
    assert client.get(reverse("admin:accounts_apikey_delete", args=[api_key.pk])).status_code == 403
    # Changing the key shows the secret no more than viewing it.
    changed = client.post(
        reverse("admin:accounts_apikey_change", args=[api_key.pk]),
        {"name": "renamed", "status": "ENABLE", "ip_list": "", "reason": "rename", "_save": "Save"},
        follow=True,
    )
    assert changed.status_code == 200
    assert secret not in changed.content.decode()
    assert secret not in str(list(StaffAction.objects.values("before", "after")))
