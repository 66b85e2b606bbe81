"""Roles in code (exchange/backoffice/roles.py): Support reads, Treasury handles money, Administrator does
everything operators do; the legacy groups' members are folded in; no role may raise privileges."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.urls import reverse

from exchange.backoffice import roles
from tests.support.backoffice import awaiting_withdrawal, banned_ip, usdt_customer
from tests.support.factories import UserFactory
from tests.support.staff import ADMINISTRATOR, SUPPORT, TREASURY, logged_in, staff_member

pytestmark = pytest.mark.django_db


def _codenames(name: str) -> set[str]:
    return set(Group.objects.get(name=name).permissions.values_list("codename", flat=True))


def test_the_three_roles_exist_with_their_permissions():
    support, treasury, admin = _codenames(SUPPORT), _codenames(TREASURY), _codenames(ADMINISTRATOR)
    assert support
    assert all(codename.startswith("view_") for codename in support)
    assert {"change_withdrawal", "change_deposit", "add_manualadjustment"} <= treasury
    assert not {"change_apikey", "add_apikey", "change_ratelimitban", "change_businessstatus", "change_user"} & treasury
    assert "confirm_manualadjustment" not in treasury
    assert treasury - admin == set()  # an Administrator can do all Treasury can
    assert {"confirm_manualadjustment", "add_apikey", "change_ratelimitban", "change_businessstatus"} <= admin
    for codenames in (support, treasury, admin):
        assert not {"add_staffaction", "change_staffaction", "delete_staffaction"} & codenames


def test_legacy_groups_are_folded_into_the_new_roles():
    operator, reader = UserFactory(is_staff=True), UserFactory(is_staff=True)
    Group.objects.create(name="Operations").user_set.add(operator)
    Group.objects.create(name="Support (read-only)").user_set.add(reader)
    out = StringIO()
    call_command("sync_roles", stdout=out)
    assert "'Operations': 1 member(s) moved to 'Administrator'" in out.getvalue()
    assert not Group.objects.filter(name__in=["Operations", "Support (read-only)"]).exists()
    assert list(operator.groups.values_list("name", flat=True)) == [ADMINISTRATOR]
    assert list(reader.groups.values_list("name", flat=True)) == [SUPPORT]
    assert roles.sync_roles() == {}  # idempotent


@pytest.mark.parametrize("model", ["auth.group", "auth.permission", "exchange.staffaction"])
def test_no_role_may_be_given_a_write_on_privileges_or_the_audit(monkeypatch, model):
    grants = {name: {action: list(models) for action, models in g.items()} for name, g in roles.ROLES.items()}
    grants[TREASURY]["change"].append(model)
    monkeypatch.setattr(roles, "ROLES", grants)
    with pytest.raises(ImproperlyConfigured):
        roles.sync_roles()


def _action(client, changelist: str, action: str, pk: int):
    return client.post(
        reverse(f"admin:{changelist}_changelist"),
        {"action": action, "_selected_action": [str(pk)], "index": "0", "reason": "r"},
    )


def test_treasury_handles_money_but_not_keys_bans_business_or_accounts(django_capture_on_commit_callbacks):
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    ban = banned_ip()
    treasury = logged_in(staff_member(TREASURY))
    assert treasury.get(reverse("admin:accounts_manualadjustment_add")).status_code == 200
    assert treasury.get(reverse("admin:convert_liquidity")).status_code == 200
    assert treasury.get(reverse("admin:accounts_apikey_add")).status_code == 403
    assert treasury.get(reverse("admin:accounts_user_change", args=[alice.user.pk])).status_code == 200  # reads
    _action(treasury, "exchange_ratelimitban", "lift_bans", ban.pk)
    ban.refresh_from_db()
    assert ban.lifted_at is None
    _action(treasury, "accounts_user", "freeze_accounts", alice.user.pk)
    alice.user.refresh_from_db()
    assert alice.user.is_frozen is False
    with django_capture_on_commit_callbacks(execute=True):
        _action(treasury, "wallet_withdrawal", "approve", withdrawal.pk)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == "SUCCEEDED"


def test_support_has_no_actions_on_any_change_list():
    support = logged_in(staff_member(SUPPORT))
    usdt_customer("1")
    for changelist in (
        "wallet_withdrawal",
        "wallet_deposit",
        "exchange_ratelimitban",
        "exchange_businessstatus",
        "accounts_apikey",
        "accounts_user",
        "accounts_manualadjustment",
        "streams_listenkey",
    ):
        response = support.get(reverse(f"admin:{changelist}_changelist"))
        assert response.status_code == 200, changelist
        assert b'name="action"' not in response.content, changelist
