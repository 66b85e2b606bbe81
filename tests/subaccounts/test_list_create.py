"""List and create (issue 15, item 2)."""

from __future__ import annotations

import pytest

from accounts.models import User
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error
from tests.support.factories import UserFactory, customer


def address_of(family, name: str) -> str:
    """The address a virtual sub-account named `name` gets (subaccounts/addresses.py)."""
    local, _, domain = name.lower().rpartition("@")
    return f"{local}_{domain}@m{family.master.user.pk}.virtual.invalid"


def test_create_answers_the_sub_account_with_an_integer_create_time(family):
    body = h.ok(family.master.client.post(h.CREATE, {"accountName": "New-Sub@Test.example"}))
    assert set(body) == {"email", "createTime", "isFreeze"}
    assert body["email"] == "New-Sub@Test.example"  # the e-mail given, as sent (issue 34)
    assert isinstance(body["createTime"], int)
    assert body["isFreeze"] is False
    sub = User.objects.get(master=family.master.user, requested_email="New-Sub@Test.example")
    assert sub.email == address_of(family, "new-sub@test.example")  # its own address: the reserved space
    assert sub.is_virtual
    assert body["createTime"] == int(sub.date_joined.timestamp() * 1000)
    assert not User.objects.filter(email="new-sub@test.example").exists()  # the name's owner keeps it


def test_a_created_sub_account_cannot_log_in(family, client):
    name = h.ok(family.master.client.post(h.CREATE, {"accountName": "nologin@test.example"}))["email"]
    sub = User.objects.get(master=family.master.user, requested_email=name)
    assert not sub.has_usable_password()
    for username in (name, sub.email):
        assert not client.login(username=username, password="")
    assert not sub.api_keys.exists()


@pytest.mark.parametrize("name", ["not-an-email", "a@b", "two@@test.example", " ", "x" * 250 + "@t.example"])
def test_account_name_must_be_an_email(family, name):
    response = family.master.client.post(h.CREATE, {"accountName": name})
    assert_error(response, -1025, 400)
    assert User.objects.filter(master=family.master.user).count() == 2


def test_account_name_is_required(family):
    assert_error(family.master.client.post(h.CREATE), -1105, 400)


REGISTERED_ELSEWHERE = ["FAM-MASTER@test.example", "other-master@test.example", "other-sub1@test.example", "c@b.ex"]


@pytest.mark.parametrize("registered", REGISTERED_ELSEWHERE)
def test_a_name_registered_elsewhere_answers_like_a_free_one_and_squats_nothing(family, other_family, registered):
    """Issue 25, finding 4: the answer does not say whether anyone has the e-mail (it was -1010
    "exists" for a registered one), and the sub-account does not take it."""
    if registered == "c@b.ex":
        UserFactory(email=registered)
    before = User.objects.filter(email=registered.lower()).values_list("pk", flat=True).first()
    body = h.ok(family.master.client.post(h.CREATE, {"accountName": registered}))
    assert body["email"] == registered
    assert User.objects.get(master=family.master.user, requested_email=registered).email == address_of(
        family, registered
    )
    assert set(body) == {"email", "createTime", "isFreeze"}
    assert User.objects.filter(email=registered.lower()).values_list("pk", flat=True).first() == before


def test_a_name_is_taken_only_by_the_masters_own_sub_account(family, other_family):
    h.ok(family.master.client.post(h.CREATE, {"accountName": "dup@test.example"}))
    again = family.master.client.post(h.CREATE, {"accountName": "DUP@test.example"})
    assert_error(again, -1010, 400, msg_contains="A sub-account with this name already exists")
    h.ok(other_family.master.client.post(h.CREATE, {"accountName": "dup@test.example"}))  # another master's space


@pytest.mark.parametrize("name", ["a@virtual.invalid", "a@m1.virtual.invalid", "x@sub.m9.virtual.invalid"])
def test_a_name_in_the_reserved_domain_is_refused(family, name):
    response = family.master.client.post(h.CREATE, {"accountName": name})
    assert_error(response, -1025, 400, msg_contains="reserved for virtual sub-accounts")


def test_nobody_registers_an_address_in_the_reserved_domain(family):
    """Registration (accounts.services.user_create, used by the demo) and the admin's forms refuse
    the reserved space: a virtual sub-account's address can never be a customer's e-mail."""
    from accounts import services as account_services
    from accounts.admin import AccountCreationForm

    for email in ("who@virtual.invalid", f"x_y.z@m{family.master.user.pk}.virtual.invalid"):
        with pytest.raises(ValueError, match="reserved"):
            account_services.user_create(email=email, password="a-long-password-1")
        form = AccountCreationForm(data={"email": email, "password1": "Xy7!long-pass", "password2": "Xy7!long-pass"})
        assert not form.is_valid()
        assert "reserved for virtual sub-accounts" in str(form.errors["email"])
    assert not User.objects.filter(email__endswith="virtual.invalid").exists()


def test_every_endpoint_finds_the_sub_account_by_its_name_and_by_its_address(family):
    """The e-mail it was named with, in any case, and the address earlier versions answered."""
    master = family.master.client
    name = h.ok(master.post(h.CREATE, {"accountName": "Desk@Corp.example"}))["email"]
    assert name == "Desk@Corp.example"
    for email in (name, "desk@corp.example", "DESK@corp.example", address_of(family, name)):
        listed = h.ok(master.get(h.LIST, {"email": email}))
        assert [s["email"] for s in listed["subAccounts"]] == [name]
        assert "balances" in h.ok(master.get(h.ASSET, {"email": email}))
        h.ok(master.post(h.UNIVERSAL, {"asset": "BTC", "toEmail": email, "amount": "0.01"}))
    history = h.ok(master.get(h.UNIVERSAL_HISTORY, {"toEmail": "desk@corp.example"}))
    assert {r["toEmail"] for r in history["result"]} == {name}
    assert history["total"] == 4


def test_the_31st_virtual_sub_account_is_refused(family):
    for i in range(28):  # the family already has two
        h.ok(family.master.client.post(h.CREATE, {"accountName": f"s{i}@test.example"}))
    response = family.master.client.post(h.CREATE, {"accountName": "s-31@test.example"})
    assert_error(response, -1010, 400, msg_contains="at most 30 virtual sub-accounts")
    assert not User.objects.filter(email="s-31@test.example").exists()
    assert User.objects.filter(master=family.master.user, is_virtual=True).count() == 30


def test_the_limit_is_per_master(family, other_family):
    for i in range(28):
        UserFactory(email=f"fill{i}@test.example", master=family.master.user, is_virtual=True)
    assert_error(family.master.client.post(h.CREATE, {"accountName": "x@test.example"}), -1010)
    h.ok(other_family.master.client.post(h.CREATE, {"accountName": "x@test.example"}))


def test_list_answers_sub_accounts_and_total_with_string_create_times(family, other_family):
    family.sub2.user.is_frozen = True
    family.sub2.user.save()
    body = h.ok(family.master.client.get(h.LIST))
    assert set(body) == {"subAccounts", "total"}
    assert body["total"] == 2
    assert [s["email"] for s in body["subAccounts"]] == ["fam-sub1@test.example", "fam-sub2@test.example"]
    for item in body["subAccounts"]:
        assert set(item) == {"email", "createTime", "isFreeze"}
        assert isinstance(item["createTime"], str)
        assert item["createTime"].isdigit()
    assert [s["isFreeze"] for s in body["subAccounts"]] == [False, True]


def test_list_of_a_master_without_sub_accounts_is_empty(assets):
    loner = customer()
    assert h.ok(loner.client.get(h.LIST)) == {"subAccounts": [], "total": 0}


def test_list_email_filter(family, other_family):
    body = h.ok(family.master.client.get(h.LIST, {"email": "FAM-sub2@test.example"}))
    assert body["total"] == 1
    assert [s["email"] for s in body["subAccounts"]] == ["fam-sub2@test.example"]
    assert h.ok(family.master.client.get(h.LIST, {"email": "other-sub1@test.example"})) == {
        "subAccounts": [],
        "total": 0,
    }


def test_list_paging(family):
    for i in range(13):
        UserFactory(email=f"p{i:02d}@test.example", master=family.master.user, is_virtual=True)
    first = h.ok(family.master.client.get(h.LIST))
    assert first["total"] == 15
    assert len(first["subAccounts"]) == 10  # limit defaults to 10
    second = h.ok(family.master.client.get(h.LIST, {"page": 2}))
    assert len(second["subAccounts"]) == 5
    emails = [s["email"] for s in first["subAccounts"] + second["subAccounts"]]
    assert len(set(emails)) == 15
    assert h.ok(family.master.client.get(h.LIST, {"page": 2, "limit": 4}))["subAccounts"][0]["email"] == emails[4]
    assert h.ok(family.master.client.get(h.LIST, {"page": 9}))["subAccounts"] == []
    assert len(h.ok(family.master.client.get(h.LIST, {"limit": 200}))["subAccounts"]) == 15


@pytest.mark.parametrize("params", [{"limit": 201}, {"limit": 0}, {"page": 0}, {"page": "x"}])
def test_list_paging_bounds(family, params):
    assert_error(family.master.client.get(h.LIST, params), -1025, 400)
