"""The e-mail a master names a virtual sub-account with is the e-mail the family's endpoints answer
and take (issue 34): the create call answered a rewritten address (`x_example.com@m50.virtual.invalid`
for `accountName=x@example.com`) where the real service answers the e-mail given. The sub-account's
own address stays in the reserved space (issue 25, finding 4), so the name squats nobody: it is kept
per master (`User.requested_email`), looked up inside the family only, never a P2P address, and a
real customer may register it and receive transfers to it."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from accounts import services as account_services
from accounts.models import ApiKeyType, User
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.factories import ApiKeyFactory, NetworkFactory, customer

P2P = "/openapi/transfer/v4/transfers"
IP = "/openapi/v1/sub-account/apikey/ip-restriction"
IP_ADD = "/openapi/v1/sub-account/apikey/add-ip-restriction"
DEPOSIT_ADDRESS = "/openapi/v1/sub-account/wallet/deposit/address"
NAME = "TestSub@Gmail.com"  # as the real service's documentation shows it, with some capitals

migration = importlib.import_module("subaccounts.migrations.0004_s42f_requested_emails")


def create(who: h.Customer, name: str = NAME) -> dict:
    return h.ok(who.client.post(h.CREATE, {"accountName": name}))


def sub_named(master: h.Customer, name: str = NAME) -> User:
    return User.objects.get(master=master.user, requested_email=name)


def test_create_and_list_answer_the_e_mail_given(family):
    made = create(family.master)
    assert made["email"] == NAME
    listed = h.ok(family.master.client.get(h.LIST))
    assert [s["email"] for s in listed["subAccounts"]] == ["fam-sub1@test.example", "fam-sub2@test.example", NAME]
    for email in (NAME, NAME.lower(), NAME.upper()):
        only = h.ok(family.master.client.get(h.LIST, {"email": email}))
        assert (only["total"], [s["email"] for s in only["subAccounts"]]) == (1, [NAME])
    sub = sub_named(family.master)
    assert sub.email.endswith(f"@m{family.master.user.pk}.virtual.invalid")  # its own address: reserved space
    assert not User.objects.filter(email=NAME.lower()).exists()


def test_the_master_moves_money_by_that_e_mail_and_sees_it_in_the_history(family):
    create(family.master)
    master = family.master.client
    assert h.ok(master.post(h.UNIVERSAL, {"toEmail": NAME, "asset": "BTC", "amount": "0.3", "clientTranId": "in"}))[
        "result"
    ]
    assert h.ok(
        master.post(h.UNIVERSAL, {"fromEmail": NAME.lower(), "asset": "BTC", "amount": "0.1", "clientTranId": "out"})
    )["result"]
    assert_balance(sub_named(family.master), "BTC", "0.2")
    assert_balance(family.master.user, "BTC", "0.8")
    into = h.ok(master.get(h.UNIVERSAL_HISTORY, {"toEmail": NAME}))["result"]
    assert [(r["clientTranId"], r["fromEmail"], r["toEmail"]) for r in into] == [
        ("in", "fam-master@test.example", NAME)
    ]
    out = h.ok(master.get(h.UNIVERSAL_HISTORY, {"fromEmail": NAME}))["result"]
    assert [(r["clientTranId"], r["fromEmail"], r["toEmail"]) for r in out] == [
        ("out", NAME, "fam-master@test.example")
    ]
    balances = h.ok(master.get(h.ASSET, {"email": NAME}))["balances"]
    assert {b["asset"]: b["free"] for b in balances}["BTC"].startswith("0.2")
    assert_ledger_balanced()


def test_key_and_deposit_endpoints_take_that_e_mail(family):
    create(family.master)
    key, _ = ApiKeyFactory(user=sub_named(family.master), types=[ApiKeyType.READ_ONLY])
    master = family.master.client
    assert h.ok(master.get(IP, {"apikey": key.key, "email": NAME}))["apikey"] == key.key
    record = h.ok(
        master.post(IP_ADD, {"apikey": key.key, "email": NAME.lower(), "ipAddress": "10.0.0.1", "ipRestriction": "1"})
    )
    assert record["ipList"] == ["10.0.0.1"]
    NetworkFactory(coin__code="BTC", network="BTC")
    assert h.ok(master.get(DEPOSIT_ADDRESS, {"email": NAME, "coin": "BTC", "network": "BTC"}))["address"]


def test_nobody_outside_the_family_reaches_it_by_that_e_mail(family, other_family):
    """Another master's sub-account endpoints answer -1151 as for nobody; an outsider's P2P transfer
    to the e-mail is refused exactly as to an unknown address, and moves nothing."""
    create(family.master)
    outsider = other_family.master
    assert_error(outsider.client.get(h.ASSET, {"email": NAME}), -1151, 404)
    refused = outsider.client.post(h.UNIVERSAL, {"toEmail": NAME, "asset": "BTC", "amount": "0.1"})
    assert_error(refused, -1151, 404)
    assert h.ok(outsider.client.get(h.LIST, {"email": NAME})) == {"subAccounts": [], "total": 0}
    for sender in (outsider, family.sub1):  # a P2P transfer goes by registered e-mails only
        to_name = sender.client.post(P2P, {"account": "BTC", "target_address": NAME, "amount": "0.1"})
        to_nobody = sender.client.post(P2P, {"account": "BTC", "target_address": "nobody@x.example", "amount": "0.1"})
        assert (to_name.status_code, to_name.json()) == (to_nobody.status_code, to_nobody.json())
        assert to_name.json()["code"] == -1151
    assert_balance(sub_named(family.master), "BTC", "0")
    assert_balance(outsider.user, "BTC", "1")
    assert_ledger_balanced()


def test_a_real_customer_registers_that_e_mail_and_receives_transfers_to_it(family, other_family):
    create(family.master)
    real = customer(email=NAME.lower())  # registration: accounts.services.user_create
    assert real.user.pk != sub_named(family.master).pk
    for sender in (other_family.master, family.master):
        sent = sender.client.post(P2P, {"account": "BTC", "target_address": NAME, "amount": "0.1"})
        assert sent.status_code == 200, sent.content
    assert_balance(real.user, "BTC", "0.2")
    assert_balance(sub_named(family.master), "BTC", "0")
    # and the family still finds its own sub-account by the name
    h.ok(family.master.client.post(h.UNIVERSAL, {"toEmail": NAME, "asset": "BTC", "amount": "0.05"}))
    assert_balance(sub_named(family.master), "BTC", "0.05")
    assert_balance(real.user, "BTC", "0.2")
    assert_ledger_balanced()


def test_a_registered_e_mail_can_name_a_sub_account_and_is_not_touched(family):
    real = customer(email="owner@corp.example")
    assert create(family.master, "owner@corp.example")["email"] == "owner@corp.example"
    assert User.objects.get(pk=real.user.pk).email == "owner@corp.example"
    h.ok(family.master.client.post(h.UNIVERSAL, {"toEmail": "owner@corp.example", "asset": "BTC", "amount": "0.1"}))
    assert_balance(sub_named(family.master, "owner@corp.example"), "BTC", "0.1")
    assert_balance(real.user, "BTC", "0")


def test_two_masters_each_have_a_sub_account_with_the_same_e_mail(family, other_family):
    assert create(family.master)["email"] == create(other_family.master)["email"] == NAME
    ours, theirs = sub_named(family.master), sub_named(other_family.master)
    assert ours.pk != theirs.pk
    h.ok(family.master.client.post(h.UNIVERSAL, {"toEmail": NAME, "asset": "BTC", "amount": "0.3"}))
    h.ok(other_family.master.client.post(h.UNIVERSAL, {"toEmail": NAME, "asset": "BTC", "amount": "0.2"}))
    assert_balance(ours, "BTC", "0.3")
    assert_balance(theirs, "BTC", "0.2")
    for master in (family.master, other_family.master):
        assert [s["email"] for s in h.ok(master.client.get(h.LIST, {"email": NAME}))["subAccounts"]] == [NAME]
    assert_ledger_balanced()


def test_a_name_the_family_has_is_taken_in_any_case(family):
    create(family.master)
    for name in (NAME.lower(), NAME.upper(), "fam-sub1@test.example"):
        assert_error(family.master.client.post(h.CREATE, {"accountName": name}), -1010, 400, msg_contains="name")
    assert User.objects.filter(master=family.master.user).count() == 3


def test_the_requested_e_mail_is_one_per_master_in_the_database(family):
    from django.db import IntegrityError, transaction

    create(family.master)
    with pytest.raises(IntegrityError), transaction.atomic():
        account_services.user_create(
            email=f"other_x@m{family.master.user.pk}.virtual.invalid",
            master=family.master.user,
            is_virtual=True,
            requested_email=NAME.upper(),
        )
    with pytest.raises(ValueError, match="virtual sub-account"):
        account_services.user_create(email="plain@corp.example", requested_email="x@corp.example")


# --- the migration: existing sub-accounts get their names --------------------------------------------


def test_the_migration_names_existing_sub_accounts_and_frees_customer_like_e_mails(family):
    master = family.master.user
    space = f"m{master.pk}.virtual.invalid"
    made_before = account_services.user_create(email=f"desk.one_corp.example@{space}", master=master, is_virtual=True)
    legacy = family.sub1.user  # a virtual sub-account still holding a customer-like e-mail
    too_long = account_services.user_create(
        email=f"{'x' * 60}@{'d' * 60}.{'e' * 60}.{'f' * 60}.example", master=master, is_virtual=True
    )
    real_sub = customer(master=master, is_virtual=False, email="desk@corp.example").user
    migration.name_the_virtual_sub_accounts(apps, None)
    for user in (made_before, legacy, too_long, real_sub):
        user.refresh_from_db()
    assert (made_before.email, made_before.requested_email) == (
        f"desk.one_corp.example@{space}",
        "desk.one@corp.example",
    )
    assert (legacy.email, legacy.requested_email) == (f"fam-sub1_test.example@{space}", "fam-sub1@test.example")
    assert too_long.email == f"sub{too_long.pk}@{space}"
    assert too_long.requested_email.startswith("xxx")
    assert (real_sub.email, real_sub.requested_email) == ("desk@corp.example", "")  # not virtual: kept
    migration.name_the_virtual_sub_accounts(apps, None)  # twice: nothing more changes
    legacy.refresh_from_db()
    assert legacy.email == f"fam-sub1_test.example@{space}"

    # The master calls them by their names, the list shows them, and the freed e-mail registers.
    listed = [s["email"] for s in h.ok(family.master.client.get(h.LIST, {"limit": 10}))["subAccounts"]]
    assert "fam-sub1@test.example" in listed
    assert "desk.one@corp.example" in listed
    h.ok(
        family.master.client.post(h.UNIVERSAL, {"fromEmail": "fam-sub1@test.example", "asset": "BTC", "amount": "0.1"})
    )
    assert_balance(legacy, "BTC", "0.4")
    assert customer(email="fam-sub1@test.example").user.pk != legacy.pk
