"""The operations admin: API keys (secret shown once), bans, business status, staff roles."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from accounts.crypto import decrypt_secret
from accounts.models import ApiKey, ApiKeyStatus, User
from exchange.api import ratelimit
from exchange.api.models import RateLimitBan
from exchange.backoffice.models import StaffAction
from exchange.platform import services
from exchange.platform.models import BusinessStatus
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.staff import logged_in as _staff_client
from tests.support.staff import staff_in as _staff_in

pytestmark = pytest.mark.django_db

API_KEYS = "/openapi/v1/api-keys"
STATUS = "/openapi/v1/check-sys-status"
SECRET_RE = re.compile(r'<code id="secret-key">([^<]+)</code>')
KEY_RE = re.compile(r'<code id="api-key">([^<]+)</code>')


@pytest.fixture
def superuser(db) -> User:
    return User.objects.create_superuser(email="root@staff.example", password="pw-for-tests")


@pytest.fixture
def root(superuser) -> Client:
    return _staff_client(superuser)


@pytest.fixture
def ops_user(make_user) -> User:
    return _staff_in(make_user, "Administrator")


@pytest.fixture
def ops(ops_user) -> Client:
    return _staff_client(ops_user)


@pytest.fixture
def support(make_user) -> Client:
    return _staff_client(_staff_in(make_user, "Support"))


@pytest.fixture
def customer(make_user) -> User:
    return make_user()


def _add_key(client: Client, user: User, **fields):
    data = {"user": user.pk, "name": "admin-made", "ip_list": "", "reason": "customer asked", "_save": "Save", **fields}
    return client.post(reverse("admin:accounts_apikey_add"), data)


def _action(client: Client, model: str, action: str, pks: list[int]):
    return client.post(
        reverse(f"admin:{model}_changelist"),
        {"action": action, "_selected_action": [str(pk) for pk in pks], "index": "0", "reason": "test reason"},
    )


# --- pages ---------------------------------------------------------------------------------------


def test_login_page_and_index(root):
    assert Client().get(reverse("admin:login")).status_code == 200
    response = root.get(reverse("admin:index"))
    assert response.status_code == 200
    assert b"Exchange operations" in response.content


def test_every_registered_changelist_opens_for_a_superuser(root, customer, make_key):
    make_key(customer)
    ratelimit.rate_limit_ban_create(ip="192.0.2.1", reason="test")
    services.business_status_set(business_type="SPOT", is_on=True)
    assert admin.site._registry, "nothing registered"
    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = root.get(url)
        assert response.status_code == 200, (url, response.status_code)


def test_change_pages_open(root, customer, make_key):
    api_key, _ = make_key(customer)
    ban = ratelimit.rate_limit_ban_create(ip="192.0.2.1", reason="test")
    status = services.business_status_set(business_type="SPOT", is_on=True)
    for url in (
        reverse("admin:accounts_apikey_change", args=[api_key.pk]),
        reverse("admin:accounts_user_change", args=[customer.pk]),
        reverse("admin:exchange_ratelimitban_change", args=[ban.pk]),
        reverse("admin:exchange_businessstatus_change", args=[status.pk]),
        reverse("admin:accounts_apikey_add"),
        reverse("admin:accounts_user_add"),
    ):
        assert root.get(url).status_code == 200, url


# --- API keys ------------------------------------------------------------------------------------


def test_adding_a_key_shows_the_secret_once_and_stores_it_encrypted(root, customer):
    # Types asked in a crafted POST are ignored: a key made by staff is Read only (issue 25, 3b).
    response = _add_key(root, customer, name="desk", types=["Enable Spot", "Enable Convert"])
    assert response.status_code == 200, response.content[:500]
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    secret = SECRET_RE.search(html).group(1)
    shown_key = KEY_RE.search(html).group(1)
    assert len(secret) == 64
    assert html.count(secret) == 1

    api_key = ApiKey.objects.get(user=customer, name="desk")
    assert api_key.key == shown_key
    assert api_key.types == ["Read only"]
    assert api_key.status == ApiKeyStatus.ENABLE
    assert secret not in api_key.secret_ciphertext
    assert decrypt_secret(api_key.secret_ciphertext) == secret

    for url in (
        reverse("admin:accounts_apikey_change", args=[api_key.pk]),
        reverse("admin:accounts_apikey_changelist"),
        reverse("admin:index"),
    ):
        page = root.get(url)
        assert page.status_code == 200
        assert secret.encode() not in page.content, url
    assert not LogEntry.objects.filter(change_message__contains=secret).exists()
    assert not any(secret in str(value) for value in root.session.values())

    # The shown secret is the one that signs.
    signed = SignedClient(shown_key, secret).get(API_KEYS)
    assert signed.status_code == 200, signed.content
    assert [item["apiName"] for item in signed.json()] == ["desk"]


def test_adding_a_key_with_an_ip_list_restricts_it(root, customer):
    response = _add_key(root, customer, name="bot", ip_list="203.0.113.7\n10.0.0.0/24", ip_restrict="on")
    secret = SECRET_RE.search(response.content.decode()).group(1)
    api_key = ApiKey.objects.get(name="bot")
    assert api_key.ip_restrict is True
    assert api_key.ip_list == ["203.0.113.7", "10.0.0.0/24"]
    signer = SignedClient(api_key.key, secret)
    assert signer.get(API_KEYS, ip="10.0.0.9").status_code == 200
    assert_error(signer.get(API_KEYS, ip="198.51.100.1"), -2017, 401)


def test_adding_a_key_with_a_bad_ip_is_refused_by_the_form(root, customer):
    response = _add_key(root, customer, name="bad", ip_list="not-an-ip", ip_restrict="on")
    assert response.status_code == 200
    assert b"Not an IP address or network" in response.content
    assert not ApiKey.objects.filter(name="bad").exists()


def test_disabling_a_key_in_the_admin_refuses_its_requests(root, customer, make_key):
    api_key, secret = make_key(customer)
    signer = SignedClient(api_key.key, secret)
    assert signer.get(API_KEYS).status_code == 200
    response = _action(root, "accounts_apikey", "disable_keys", [api_key.pk])
    assert response.status_code == 302
    api_key.refresh_from_db()
    assert api_key.status == ApiKeyStatus.NOT_ENABLE
    assert_error(signer.get(API_KEYS), -2015, 401)

    _action(root, "accounts_apikey", "enable_keys", [api_key.pk])
    assert signer.get(API_KEYS).status_code == 200


def test_disabling_a_key_on_its_change_page(root, customer, make_key):
    api_key, secret = make_key(customer, types=["Enable Spot"])
    url = reverse("admin:accounts_apikey_change", args=[api_key.pk])
    response = root.post(
        url,
        {
            "name": api_key.name,
            "types": ["Enable Spot"],
            "status": "NOT_ENABLE",
            "ip_list": "",
            "reason": "leaked",
            "_save": "Save",
        },
    )
    assert response.status_code == 302, response.content[:500]
    assert_error(SignedClient(api_key.key, secret).get(API_KEYS), -2015, 401)


# --- bans ----------------------------------------------------------------------------------------


def test_ban_changelist_shows_bans_and_lift_action_lifts_only_the_selected(root, client):
    ban_a = ratelimit.rate_limit_ban_create(ip="192.0.2.1", reason="test a")
    ratelimit.rate_limit_ban_create(ip="192.0.2.2", reason="test b")
    assert_error(client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.1"), -1003, 418)

    page = root.get(reverse("admin:exchange_ratelimitban_changelist"))
    assert page.status_code == 200
    assert b"192.0.2.1" in page.content
    assert b"192.0.2.2" in page.content

    response = _action(root, "exchange_ratelimitban", "lift_bans", [ban_a.pk])
    assert response.status_code == 302
    ban_a.refresh_from_db()
    assert ban_a.lifted_at is not None
    assert ban_a.lifted_by.email == "root@staff.example"
    assert client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.1").status_code == 200
    assert_error(client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.2"), -1003, 418)
    assert RateLimitBan.objects.get(ip="192.0.2.2").lifted_at is None


def test_bans_cannot_be_added_in_the_admin(root):
    assert root.get(reverse("admin:exchange_ratelimitban_add")).status_code == 403


def test_operations_can_lift_a_ban(ops, client):
    ban = ratelimit.rate_limit_ban_create(ip="192.0.2.3", reason="test")
    assert _action(ops, "exchange_ratelimitban", "lift_bans", [ban.pk]).status_code == 302
    ban.refresh_from_db()
    assert ban.lifted_at is not None
    assert client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.3").status_code == 200


# --- business status -----------------------------------------------------------------------------


def _switch_business(client: Client, business_type: str, is_on: bool):
    """Through the admin: change the row when there is one, otherwise add it."""
    data = {"business_type": business_type, "reason": "maintenance", "_save": "Save"}
    if is_on:
        data["is_on"] = "on"
    row = BusinessStatus.objects.filter(business_type=business_type).first()
    if row is None:
        return client.post(reverse("admin:exchange_businessstatus_add"), data)
    return client.post(reverse("admin:exchange_businessstatus_change", args=[row.pk]), data)


def test_superuser_switches_convert_off_and_on(root, superuser, client):
    response = _switch_business(root, "CONVERT", is_on=False)
    assert response.status_code == 302, response.content[:500]
    assert client.get(STATUS, {"businessType": "CONVERT"}).json() == [
        {"businessType": "CONVERT", "businessStatus": "off"}
    ]
    row = BusinessStatus.objects.get(business_type="CONVERT")
    assert row.updated_by == superuser
    assert root.get(reverse("admin:exchange_businessstatus_changelist")).status_code == 200

    assert _switch_business(root, "CONVERT", is_on=True).status_code == 302
    assert client.get(STATUS).json() == [
        {"businessType": "SPOT", "businessStatus": "on"},
        {"businessType": "CONVERT", "businessStatus": "on"},
    ]


def test_operations_can_switch_a_business_off_on_a_fresh_install(ops, client):
    """roles.py: Operations "switch businesses". On a fresh install there is no BusinessStatus row yet."""
    response = _switch_business(ops, "SPOT", is_on=False)
    assert response.status_code == 302, response.status_code
    assert client.get(STATUS, {"businessType": "SPOT"}).json() == [{"businessType": "SPOT", "businessStatus": "off"}]


def test_operations_switch_an_existing_business_row_off(ops, ops_user, client):
    row = services.business_status_set(business_type="SPOT", is_on=True)
    response = ops.post(
        reverse("admin:exchange_businessstatus_change", args=[row.pk]),
        {"business_type": "SPOT", "reason": "maintenance", "_save": "Save"},
    )
    assert response.status_code == 302
    assert client.get(STATUS, {"businessType": "SPOT"}).json() == [{"businessType": "SPOT", "businessStatus": "off"}]
    row.refresh_from_db()
    assert row.updated_by == ops_user


# --- roles ---------------------------------------------------------------------------------------


def test_roles_exist_after_migrate():
    assert set(Group.objects.values_list("name", flat=True)) >= {"Administrator", "Support"}
    ops_perms = set(Group.objects.get(name="Administrator").permissions.values_list("codename", flat=True))
    assert {"add_apikey", "change_apikey", "change_ratelimitban", "change_businessstatus"} <= ops_perms
    support_perms = set(Group.objects.get(name="Support").permissions.values_list("codename", flat=True))
    assert support_perms
    assert all(codename.startswith("view_") for codename in support_perms)


def test_operations_can_add_a_key(ops, customer):
    assert ops.get(reverse("admin:accounts_apikey_add")).status_code == 200
    response = _add_key(ops, customer, name="by-ops")
    assert response.status_code == 200
    assert SECRET_RE.search(response.content.decode())
    assert ApiKey.objects.filter(name="by-ops", user=customer).exists()


def test_support_can_view_the_lists(support, customer, make_key):
    make_key(customer)
    ratelimit.rate_limit_ban_create(ip="192.0.2.4", reason="test")
    assert support.get(reverse("admin:index")).status_code == 200
    for name in ("accounts_apikey", "accounts_user", "exchange_ratelimitban", "exchange_businessstatus"):
        assert support.get(reverse(f"admin:{name}_changelist")).status_code == 200, name


def test_support_can_open_an_api_key_read_only(support, customer, make_key):
    api_key, secret = make_key(customer, ip_list=["203.0.113.7"])
    response = support.get(reverse("admin:accounts_apikey_change", args=[api_key.pk]))
    assert response.status_code == 200
    assert api_key.name.encode() in response.content
    assert secret.encode() not in response.content
    assert b'name="_save"' not in response.content


def test_support_can_open_the_other_change_pages_read_only(support, customer):
    """Each page shows its row with no field to edit and no button to save; a save sent anyway is
    refused (403) and changes nothing."""
    ban = ratelimit.rate_limit_ban_create(ip="192.0.2.4", reason="test")
    row = services.business_status_set(business_type="SPOT", is_on=True)
    pages = [
        ("accounts_user", customer, customer.email, {"email": "taken-over@test.example", "is_active": "on"}),
        ("exchange_ratelimitban", ban, "192.0.2.4", {"ip": "192.0.2.4", "reason": "lifted", "lifted": "on"}),
        ("exchange_businessstatus", row, "SPOT", {"business_type": "SPOT", "reason": "maintenance"}),
    ]
    for name, obj, shown, edit in pages:
        url = reverse(f"admin:{name}_change", args=[obj.pk])
        before = type(obj).objects.filter(pk=obj.pk).values().get()
        response = support.get(url)
        assert response.status_code == 200, url
        assert response.context["original"].pk == obj.pk, url
        assert shown.encode() in response.content, url
        assert response.context["has_change_permission"] is False, url
        shown_fields = [field for fieldset in response.context["adminform"] for line in fieldset for field in line]
        assert shown_fields, url
        assert [field.field.name for field in shown_fields if not field.is_readonly] == [], url
        assert not re.search(
            rb"<(textarea|select)\b|<input[^>]*type=\"(text|checkbox|email|number)\"", response.content
        )
        for button in (b'name="_save"', b'name="_continue"', b'name="_addanother"', b"deletelink"):
            assert button not in response.content, (url, button)

        assert support.post(url, {**edit, "_save": "Save"}).status_code == 403, url
        assert type(obj).objects.filter(pk=obj.pk).values().get() == before, url


def test_support_gets_403_on_the_api_key_add_page(support, customer):
    assert support.get(reverse("admin:accounts_apikey_add")).status_code == 403
    assert _add_key(support, customer, name="by-support").status_code == 403
    assert not ApiKey.objects.filter(name="by-support").exists()


def test_support_cannot_disable_keys_lift_bans_or_switch_businesses(support, customer, make_key, client):
    api_key, _ = make_key(customer)
    ban = ratelimit.rate_limit_ban_create(ip="192.0.2.4", reason="test")
    row = services.business_status_set(business_type="SPOT", is_on=True)

    _action(support, "accounts_apikey", "disable_keys", [api_key.pk])
    api_key.refresh_from_db()
    assert api_key.status == ApiKeyStatus.ENABLE

    _action(support, "exchange_ratelimitban", "lift_bans", [ban.pk])
    ban.refresh_from_db()
    assert ban.lifted_at is None
    assert_error(client.get("/openapi/v1/ping", REMOTE_ADDR="192.0.2.4"), -1003, 418)

    response = support.post(
        reverse("admin:exchange_businessstatus_change", args=[row.pk]), {"business_type": "SPOT", "_save": "Save"}
    )
    assert response.status_code == 403
    row.refresh_from_db()
    assert row.is_on is True


def test_a_customer_cannot_open_the_admin(customer):
    response = _staff_client(customer).get(reverse("admin:index"))
    assert response.status_code == 302
    assert reverse("admin:login") in response["Location"]


# --- users ---------------------------------------------------------------------------------------


def _add_user(client: Client, **fields):
    data = {"email": "", "phone": "", "master": "", "password1": "Pw-for-tests-123", "password2": "Pw-for-tests-123"}
    data.update({"reason": "ticket 12: new customer", "_save": "Save", **fields})
    return client.post(reverse("admin:accounts_user_add"), data)


def test_operations_add_a_customer_account(ops, ops_user):
    """Audited, with its reason; the phone stored normalised. (Under a master: issue 34,
    tests/backoffice/test_identifiers_four_eyes.py.)"""
    response = _add_user(ops, email="new.customer@test.example", phone="+63 (917) 000-0099")
    assert response.status_code == 302, response.content[:800]
    user = User.objects.get(email="new.customer@test.example")
    assert user.master is None
    assert user.phone == "+639170000099"
    assert user.check_password("Pw-for-tests-123")
    assert not user.is_staff
    created = StaffAction.objects.get(action="account.create")
    assert (created.actor, created.object_id, created.reason) == (ops_user, str(user.pk), "ticket 12: new customer")


def test_adding_an_account_needs_a_reason_and_a_phone_nobody_has(ops, make_user):
    make_user(phone="+639170000099")
    no_reason = _add_user(ops, email="a@test.example", reason="")
    assert no_reason.status_code == 200
    assert "reason" in no_reason.context["adminform"].form.errors
    taken = _add_user(ops, email="b@test.example", phone="+63 917 000 0099")
    assert taken.status_code == 200
    assert "Another account has this phone number" in str(taken.context["adminform"].form.errors["phone"])
    assert not User.objects.filter(email__in=["a@test.example", "b@test.example"]).exists()
    assert not StaffAction.objects.exists()


def test_admin_stores_an_email_the_way_the_service_does(root):
    """Accounts are found by lower-cased e-mail (transfers, `manage.py apikey create`)."""
    response = _add_user(root, email="Mixed.Case@Test.Example")
    assert response.status_code == 302, response.content[:800]
    assert User.objects.filter(email="mixed.case@test.example").exists()


def test_admin_refuses_a_sub_account_as_master(root, make_user, master):
    sub = make_user(master=master)
    response = _add_user(root, email="subsub@test.example", master=str(sub.pk))
    assert response.status_code == 200
    assert not User.objects.filter(email="subsub@test.example").exists()


def test_business_statuses_are_seeded_and_cannot_be_added_or_deleted(root):
    """SPOT and CONVERT exist from the first migrate; the admin only switches them."""
    assert set(BusinessStatus.objects.values_list("business_type", flat=True)) == {"SPOT", "CONVERT"}
    assert root.get(reverse("admin:exchange_businessstatus_add")).status_code == 403
    row = BusinessStatus.objects.get(business_type="CONVERT")
    assert root.get(reverse("admin:exchange_businessstatus_delete", args=[row.pk])).status_code == 403
