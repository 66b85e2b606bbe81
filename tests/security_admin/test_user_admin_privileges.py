"""Security review, issue 12 (1): the Operations group changes users, but only a superuser grants or
changes staff status, superuser status, groups and permissions, and only a superuser edits a staff
member's or a superuser's record."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse

from accounts.models import User
from exchange.backoffice import roles
from tests.support.staff import logged_in as _logged_in
from tests.support.staff import staff_in as _staff_in

pytestmark = pytest.mark.django_db

PRIVILEGE_INPUTS = ("is_superuser", "is_staff", "groups", "user_permissions")


@pytest.fixture
def superuser(db) -> User:
    return User.objects.create_superuser(email="root@staff.example", password="pw-for-tests")


@pytest.fixture
def ops_user(make_user) -> User:
    return _staff_in(make_user, "Administrator")


@pytest.fixture
def ops(ops_user) -> Client:
    return _logged_in(ops_user)


@pytest.fixture
def customer(make_user) -> User:
    return make_user()


def _change_url(user: User) -> str:
    return reverse("admin:accounts_user_change", args=[user.pk])


def _editable_inputs(html: str) -> set[str]:
    """Names of the form controls on a change page (read-only fields are rendered as text)."""
    return set(re.findall(r'<(?:input|select|textarea)[^>]*?\sname="([^"]+)"', html))


def _crafted_post(user: User, **extra) -> dict:
    """The change form as a browser would send it for `user`, plus the privilege fields an attacker adds."""
    data = {
        "email": user.email,
        "phone": user.phone or "",
        "master": "",
        "is_active": "on",
        "can_trade": "on",
        "can_deposit": "on",
        "can_withdraw": "on",
        "base_token": user.base_token,
        "limit_tier": "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
        "is_superuser": "on",
        "is_staff": "on",
        "groups": [str(group.pk) for group in Group.objects.all()],
        "user_permissions": [str(Permission.objects.get(codename="delete_user").pk)],
        "reason": "test reason",  # a change is audited
        "_save": "Save",
    }
    data.update(extra)
    return data


def _privileges(user: User) -> tuple:
    user.refresh_from_db()
    return (
        user.is_staff,
        user.is_superuser,
        sorted(user.groups.values_list("name", flat=True)),
        sorted(user.user_permissions.values_list("codename", flat=True)),
    )


# --- an operator -------------------------------------------------------------------------------


def test_operator_sees_the_privilege_fields_of_their_own_record_read_only(ops, ops_user):
    response = ops.get(_change_url(ops_user))
    assert response.status_code == 200
    inputs = _editable_inputs(response.content.decode())
    assert "email" in inputs  # the record itself is editable
    assert not set(PRIVILEGE_INPUTS) & inputs, inputs


def test_operator_sees_the_privilege_fields_of_a_customer_read_only(ops, customer):
    response = ops.get(_change_url(customer))
    assert response.status_code == 200
    inputs = _editable_inputs(response.content.decode())
    assert "email" in inputs
    assert not set(PRIVILEGE_INPUTS) & inputs, inputs


def test_operator_cannot_make_themselves_superuser_with_a_crafted_post(ops, ops_user):
    before = _privileges(ops_user)
    assert before == (True, False, ["Administrator"], [])
    response = ops.post(_change_url(ops_user), _crafted_post(ops_user, base_token="USDT"))
    assert response.status_code == 302, response.content[:800]
    assert _privileges(ops_user) == before
    assert ops_user.base_token == "USDT"  # the rest of the form was saved (a phone would wait: issue 34)


def test_operator_cannot_make_a_customer_staff_or_superuser(ops, customer):
    before = _privileges(customer)
    assert before == (False, False, [], [])
    response = ops.post(_change_url(customer), _crafted_post(customer, base_token="USDT"))
    assert response.status_code == 302, response.content[:800]
    assert _privileges(customer) == before
    assert customer.base_token == "USDT"


def test_operator_cannot_create_a_privileged_account(ops):
    data = {
        "email": "crafted@test.example",
        "phone": "",
        "master": "",
        "password1": "Pw-for-tests-123",
        "password2": "Pw-for-tests-123",
        "is_superuser": "on",
        "is_staff": "on",
        "groups": [str(Group.objects.get(name="Administrator").pk)],
        "reason": "test reason",
        "_save": "Save",
    }
    response = ops.post(reverse("admin:accounts_user_add"), data)
    assert response.status_code == 302, response.content[:800]
    assert _privileges(User.objects.get(email="crafted@test.example")) == (False, False, [], [])


def test_operator_cannot_edit_a_superuser(ops, superuser):
    page = ops.get(_change_url(superuser))
    assert page.status_code == 200  # Operations views everything
    assert b'name="_save"' not in page.content
    assert not _editable_inputs(page.content.decode()) & {"email", "is_active", "is_superuser"}

    response = ops.post(
        _change_url(superuser), _crafted_post(superuser, email="mine@staff.example", is_active="", is_superuser="")
    )
    assert response.status_code == 403
    superuser.refresh_from_db()
    assert superuser.email == "root@staff.example"
    assert superuser.is_active
    assert superuser.is_superuser


def test_operator_cannot_change_a_superusers_password(ops, superuser):
    url = reverse("admin:auth_user_password_change", args=[superuser.pk])
    assert ops.get(url).status_code == 403
    response = ops.post(url, {"password1": "Taken-over-123", "password2": "Taken-over-123", "usable_password": "true"})
    assert response.status_code == 403
    superuser.refresh_from_db()
    assert superuser.check_password("pw-for-tests")


def test_operator_cannot_edit_another_staff_member(ops, make_user):
    colleague = _staff_in(make_user, "Support")
    before = _privileges(colleague)
    response = ops.post(_change_url(colleague), _crafted_post(colleague, email="hijacked@test.example"))
    assert response.status_code == 403
    assert _privileges(colleague) == before
    assert colleague.email != "hijacked@test.example"
    url = reverse("admin:auth_user_password_change", args=[colleague.pk])
    assert ops.post(url, {"password1": "Taken-over-123", "password2": "Taken-over-123"}).status_code == 403


def test_operator_can_still_change_a_customers_password(ops, customer):
    url = reverse("admin:auth_user_password_change", args=[customer.pk])
    response = ops.post(url, {"password1": "New-pw-for-tests-1", "password2": "New-pw-for-tests-1"})
    assert response.status_code == 302, response.content[:800]
    customer.refresh_from_db()
    assert customer.check_password("New-pw-for-tests-1")


# --- a superuser -------------------------------------------------------------------------------


def test_superuser_sees_and_sets_the_privilege_fields(superuser, ops_user):
    root = _logged_in(superuser)
    page = root.get(_change_url(ops_user))
    assert page.status_code == 200
    assert set(PRIVILEGE_INPUTS) <= _editable_inputs(page.content.decode())

    response = root.post(_change_url(ops_user), _crafted_post(ops_user))
    assert response.status_code == 302, response.content[:800]
    assert _privileges(ops_user) == (True, True, ["Administrator", "Support", "Treasury"], ["delete_user"])

    response = root.post(
        _change_url(ops_user), _crafted_post(ops_user, is_superuser="", is_staff="", groups=[], user_permissions=[])
    )
    assert response.status_code == 302, response.content[:800]
    assert _privileges(ops_user) == (False, False, [], [])


def test_superuser_edits_their_own_permission_fields(superuser):
    root = _logged_in(superuser)
    support = Group.objects.get(name="Support")
    response = root.post(_change_url(superuser), _crafted_post(superuser, groups=[str(support.pk)]))
    assert response.status_code == 302, response.content[:800]
    assert _privileges(superuser) == (True, True, ["Support"], ["delete_user"])


# --- roles -------------------------------------------------------------------------------------


def test_no_role_holds_a_permission_outside_our_apps():
    for name in roles.ROLES:
        labels = set(Group.objects.get(name=name).permissions.values_list("content_type__app_label", flat=True))
        assert labels <= set(roles.OUR_APPS), (name, labels)


@pytest.mark.parametrize("model", ["auth.group", "auth.permission", "sessions.session"])
def test_sync_roles_refuses_a_grant_on_djangos_own_apps(monkeypatch, model):
    grants = {name: dict(value) for name, value in roles.ROLES.items()}
    grants["Administrator"]["change"] = [*grants["Administrator"]["change"], model]
    monkeypatch.setattr(roles, "ROLES", grants)
    before = set(Group.objects.get(name="Administrator").permissions.values_list("pk", flat=True))
    with pytest.raises(ImproperlyConfigured, match=model):
        roles.sync_roles()
    assert set(Group.objects.get(name="Administrator").permissions.values_list("pk", flat=True)) == before
