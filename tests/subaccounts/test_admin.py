"""The sub-accounts in the admin (issue 15, item 10): a master's page lists its sub-accounts with
links to each and to a new API key for it; operators freeze and unfreeze accounts from the list
(the sub-account's keys are refused on the very next request, and allowed again after); Support
sees everything and changes nothing; staff and house accounts are never frozen by an action; a key
created for a sub-account in the admin belongs to it and signs its requests; the family's transfers
are listed read-only."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from accounts.models import ApiKey, SystemRole, User
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.staff import logged_in, staff_in

USERS = reverse("admin:accounts_user_changelist")


@pytest.fixture
def operations(make_user):
    return logged_in(staff_in(make_user, "Administrator"))


@pytest.fixture
def support(make_user):
    return logged_in(staff_in(make_user, "Support"))


def _act(client, action: str, *users: User):
    return client.post(
        USERS, {"action": action, "_selected_action": [u.pk for u in users], "reason": "test reason"}, follow=True
    )


def test_a_masters_page_lists_its_sub_accounts_with_links(family, other_family, operations):
    page = operations.get(reverse("admin:accounts_user_change", args=[family.master.user.pk])).content.decode()
    for sub in (family.sub1.user, family.sub2.user):
        assert sub.email in page
        assert reverse("admin:accounts_user_change", args=[sub.pk]) in page
        assert f"{reverse('admin:accounts_apikey_add')}?user={sub.pk}" in page
    assert other_family.sub1.user.email not in page


def test_a_sub_accounts_page_has_no_sub_account_list(family, operations):
    page = operations.get(reverse("admin:accounts_user_change", args=[family.sub1.user.pk])).content.decode()
    assert "Create an API key" not in page
    assert family.master.user.email in page  # its master


@pytest.mark.parametrize(
    ("kind", "present", "absent"), [("sub", ["sub1", "sub2"], ["master"]), ("master", ["master"], ["sub1"])]
)
def test_the_kind_filter(family, operations, kind, present, absent):
    page = operations.get(USERS, {"kind": kind}).content.decode()
    row = {
        name: reverse("admin:accounts_user_change", args=[getattr(family, name).user.pk]) for name in present + absent
    }
    for name in present:
        assert row[name] in page
    for name in absent:
        assert row[name] not in page


def test_freezing_refuses_the_sub_accounts_key_at_once_and_unfreezing_allows_it(family, operations):
    sub = family.sub1
    request = (h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.01"})
    assert h.ok(sub.client.post(*request))["result"] is True

    response = _act(operations, "freeze_accounts", sub.user)
    assert "1 account(s) frozen." in response.content.decode()
    sub.user.refresh_from_db()
    assert sub.user.is_frozen
    assert_error(sub.client.post(*request), -2015)
    # the master cannot move its money out either (checked again under the ledger's lock)
    refused = family.master.client.post(h.UNIVERSAL, {"fromEmail": sub.user.email, "asset": "BTC", "amount": "0.01"})
    assert_error(refused, -1152)

    response = _act(operations, "unfreeze_accounts", sub.user)
    assert "1 account(s) unfrozen." in response.content.decode()
    assert h.ok(sub.client.post(*request))["result"] is True


def test_staff_and_house_accounts_are_skipped(family, operations, make_user):
    colleague = make_user(is_staff=True)
    house = User.objects.filter(system_role=SystemRole.FEES).first()
    response = _act(operations, "freeze_accounts", colleague, house, family.sub2.user)
    text = response.content.decode()
    assert "1 account(s) frozen." in text
    assert "2 account(s) skipped" in text
    colleague.refresh_from_db()
    house.refresh_from_db()
    assert not colleague.is_frozen
    assert not house.is_frozen
    assert User.objects.get(pk=family.sub2.user.pk).is_frozen


def test_support_sees_but_cannot_freeze(family, support):
    page = support.get(reverse("admin:accounts_user_change", args=[family.master.user.pk]))
    assert page.status_code == 200
    assert family.sub1.user.email in page.content.decode()
    listing = support.get(USERS).content.decode()
    assert "freeze_accounts" not in listing
    _act(support, "freeze_accounts", family.sub1.user)
    assert not User.objects.get(pk=family.sub1.user.pk).is_frozen


def test_a_key_created_for_a_sub_account_belongs_to_it_and_works(family, operations):
    sub = family.sub2.user
    form = operations.get(reverse("admin:accounts_apikey_add"), {"user": sub.pk}).content.decode()
    assert re.search(rf'name="user"[^>]*value="{sub.pk}"', form), "the sub-account is filled in"
    response = operations.post(
        reverse("admin:accounts_apikey_add"),
        {
            "user": sub.pk,
            "name": "ops-made",
            "types": ["Enable Crypto Wallet"],
            "status": "ENABLE",
            "ip_list": "",
            "reason": "master asked",
        },
    )
    assert response.status_code == 200, response.content[:500]
    key = ApiKey.objects.get(user=sub, name="ops-made")
    secret = re.search(r'<code id="secret-key">([A-Za-z0-9]+)</code>', response.content.decode()).group(1)
    # its secret is shown on that page only; the key's own page does not show it again
    again = operations.get(reverse("admin:accounts_apikey_change", args=[key.pk])).content.decode()
    assert secret not in again
    client = SignedClient(key.key, secret)
    # A key made by staff is Read only (issue 25, finding 3): it signs as sub2 for reads, and no
    # write of it is accepted, whatever types the form was sent with.
    assert key.types == ["Read only"]
    assert "ops-made" in [item["apiName"] for item in h.ok(client.get("/openapi/v1/api-keys"))]
    assert_error(client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.01", "clientTranId": "ops-key"}), -1020)


def test_the_familys_transfers_are_listed_read_only(family, operations, support):
    h.ok(family.master.client.post(h.UNIVERSAL, {"toEmail": family.sub2.user.email, "asset": "BTC", "amount": "0.1"}))
    for client in (operations, support):
        response = client.get(reverse("admin:subaccounts_subaccounttransfer_changelist"))
        assert response.status_code == 200
        assert family.sub2.user.email in response.content.decode()
    assert "Add sub-account transfer" not in response.content.decode()
