"""`manage.py demo` and `manage.py apikey`."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from accounts.crypto import decrypt_secret
from accounts.demo import CUSTOMER_FUNDING
from accounts.models import ApiKey, ApiKeyStatus, User
from tests.support.assertions import assert_balance, assert_error
from tests.support.client import SignedClient
from wallet.models import Network, WhitelistAddress

pytestmark = pytest.mark.django_db

API_KEYS = "/openapi/v1/api-keys"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def demo() -> dict:
    return json.loads(run("demo", "--json"))


# --- demo ----------------------------------------------------------------------------------------


def test_demo_json_has_exactly_the_four_roles_and_their_fields():
    world = demo()
    assert set(world) == {"master", "sub", "peer", "readonly"}
    assert set(world["master"]) == {"email", "phone", "api_key", "secret_key"}
    assert set(world["peer"]) == {"email", "phone", "api_key", "secret_key"}
    assert set(world["sub"]) == {"email", "api_key", "secret_key"}
    assert set(world["readonly"]) == {"email", "api_key", "secret_key"}
    for entry in world.values():
        assert all(isinstance(value, str) and value for value in entry.values()), entry
    assert world["master"]["phone"] != world["peer"]["phone"]
    keys = [entry["api_key"] for entry in world.values()]
    assert len(set(keys)) == 4


def test_demo_is_idempotent():
    first = run("demo", "--json")
    customers = User.objects.filter(system_role__isnull=True)
    users, keys = customers.count(), ApiKey.objects.count()
    assert (users, keys) == (4, 4)  # master, sub1, peer, sub2 (subaccounts.demo, without a key)
    second = run("demo", "--json")
    assert json.loads(second) == json.loads(first)
    assert (customers.count(), ApiKey.objects.count()) == (users, keys)


def test_demo_leaves_a_number_another_account_has_to_that_account(make_user, caplog):
    """Phone numbers are unique compared normalised (issue 34): the demo's peer is created without
    its number when an account already has it, written another way; the transfer to it still
    reaches that account."""
    holder = make_user(email="holder@test.example")
    User.objects.filter(pk=holder.pk).update(phone="+63 917 000 0002")  # as stored before the rule
    world = demo()
    assert world["peer"]["phone"] is None
    assert User.objects.get(email="peer@demo.exchange").phone is None
    assert "peer@demo.exchange is created without its phone number" in caplog.text
    master = SignedClient(world["master"]["api_key"], world["master"]["secret_key"])
    response = master.post(
        "/openapi/transfer/v4/transfers", {"account": "PHP", "target_address": "+639170000002", "amount": "1"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["transfer"]["target_address"] == "+639170000002"
    assert_balance(holder, "PHP", "1")


def test_demo_relations_and_key_types():
    world = demo()
    master = User.objects.get(email=world["master"]["email"])
    sub = User.objects.get(email=world["sub"]["email"])
    peer = User.objects.get(email=world["peer"]["email"])
    assert sub.master == master
    assert master.master is None
    assert peer.master is None
    assert master.phone == world["master"]["phone"]
    assert peer.phone == world["peer"]["phone"]

    readonly = ApiKey.objects.get(key=world["readonly"]["api_key"])
    assert readonly.user == master
    assert world["readonly"]["email"] == master.email
    assert readonly.types == ["Read only"]
    master_key = ApiKey.objects.get(key=world["master"]["api_key"])
    assert "Read only" not in master_key.types
    assert {"Enable Spot", "Enable Convert"} <= set(master_key.types)
    for role in ("master", "sub", "peer", "readonly"):
        stored = ApiKey.objects.get(key=world[role]["api_key"])
        assert decrypt_secret(stored.secret_ciphertext) == world[role]["secret_key"]
        assert world[role]["secret_key"] not in stored.secret_ciphertext


def test_demo_keys_authenticate_signed_requests():
    world = demo()
    master = SignedClient(world["master"]["api_key"], world["master"]["secret_key"])
    response = master.get(API_KEYS)
    assert response.status_code == 200, response.content
    listed = {item["apiKey"]: item for item in response.json()}
    assert set(listed) == {world["master"]["api_key"], world["readonly"]["api_key"]}
    assert listed[world["readonly"]["api_key"]]["apiType"] == ["Read only"]

    for role in ("sub", "peer"):
        response = SignedClient(world[role]["api_key"], world[role]["secret_key"]).get(API_KEYS)
        assert response.status_code == 200, (role, response.content)
        assert [item["apiKey"] for item in response.json()] == [world[role]["api_key"]]

    readonly = SignedClient(world["readonly"]["api_key"], world["readonly"]["secret_key"]).get(API_KEYS)
    assert readonly.status_code == 200, readonly.content

    wrong = SignedClient(world["master"]["api_key"], world["peer"]["secret_key"]).get(API_KEYS)
    assert_error(wrong, -1022, 401)


def test_demo_without_json_does_not_print_secrets():
    text = run("demo")
    world = demo()
    for entry in world.values():
        assert entry["api_key"] in text
        assert entry["secret_key"] not in text


@override_settings(SETTINGS_MODULE="exchange.settings.production")
def test_demo_refuses_production_settings():
    with pytest.raises(CommandError):
        run("demo", "--json")
    assert not User.objects.filter(system_role__isnull=True).exists()


# --- apikey --------------------------------------------------------------------------------------


def test_apikey_create_with_type_and_ip(make_user):
    user = make_user(email="ops-made@test.example")
    payload = json.loads(run("apikey", "create", user.email, "--type", "Enable Spot", "--ip", "10.0.0.1", "--json"))
    assert set(payload) == {"email", "api_key", "secret_key", "types", "ip_list"}
    assert payload["email"] == user.email
    assert payload["types"] == ["Enable Spot"]
    assert payload["ip_list"] == ["10.0.0.1"]

    api_key = ApiKey.objects.get(key=payload["api_key"])
    assert api_key.user == user
    assert api_key.types == ["Enable Spot"]
    assert api_key.ip_restrict is True
    assert api_key.ip_list == ["10.0.0.1"]
    assert api_key.status == ApiKeyStatus.ENABLE
    assert decrypt_secret(api_key.secret_ciphertext) == payload["secret_key"]

    signer = SignedClient(payload["api_key"], payload["secret_key"])
    ok = signer.get(API_KEYS, ip="10.0.0.1")
    assert ok.status_code == 200, ok.content
    assert ok.json()[0]["ipAccessRestrictions"] == ["10.0.0.1"]
    assert_error(signer.get(API_KEYS, ip="10.0.0.2"), -2017, 401)


def test_apikey_create_with_several_types_and_without_ip(make_user):
    user = make_user()
    payload = json.loads(
        run("apikey", "create", user.email, "--type", "Enable Spot", "--type", "Enable Convert", "--json")
    )
    api_key = ApiKey.objects.get(key=payload["api_key"])
    assert api_key.types == ["Enable Spot", "Enable Convert"]
    assert api_key.ip_restrict is False
    assert api_key.ip_list == []


def test_apikey_create_without_types_gets_every_functional_type(make_user):
    user = make_user()
    payload = json.loads(run("apikey", "create", user.email, "--json"))
    assert set(payload["types"]) == {
        "Enable Spot",
        "Enable Convert",
        "Enable Crypto Wallet",
        "Enable Fiat",
        "Enable Account",
    }


def test_apikey_create_finds_the_account_whatever_the_case(make_user):
    user = make_user(email="case@test.example")
    payload = json.loads(run("apikey", "create", "CASE@Test.Example", "--json"))
    assert ApiKey.objects.get(key=payload["api_key"]).user == user


def test_apikey_create_plain_output_shows_the_secret_once(make_user):
    user = make_user()
    text = run("apikey", "create", user.email)
    api_key = ApiKey.objects.get(user=user)
    secret = decrypt_secret(api_key.secret_ciphertext)
    assert text.count(secret) == 1
    assert api_key.key in text


def test_apikey_create_for_an_unknown_email_fails():
    with pytest.raises(CommandError, match=r"nobody@test\.example"):
        run("apikey", "create", "nobody@test.example", "--json")
    assert not ApiKey.objects.exists()


def test_apikey_create_with_a_bad_ip_fails(make_user):
    user = make_user()
    with pytest.raises(CommandError):
        run("apikey", "create", user.email, "--ip", "not-an-ip")
    assert not ApiKey.objects.exists()


def test_apikey_create_with_an_unknown_type_fails(make_user):
    user = make_user()
    with pytest.raises(CommandError):
        run("apikey", "create", user.email, "--type", "Enable Futures")
    assert not ApiKey.objects.exists()


def test_apikey_disable_then_enable(make_user, make_key):
    api_key, secret = make_key(make_user())
    signer = SignedClient(api_key.key, secret)
    assert signer.get(API_KEYS).status_code == 200

    run("apikey", "disable", api_key.key)
    api_key.refresh_from_db()
    assert api_key.status == ApiKeyStatus.NOT_ENABLE
    assert_error(signer.get(API_KEYS), -2015, 401)

    run("apikey", "enable", api_key.key)
    assert signer.get(API_KEYS).status_code == 200


def test_apikey_disable_of_an_unknown_key_fails():
    with pytest.raises(CommandError):
        run("apikey", "disable", "no-such-key")


def test_demo_customers_for_the_simulation():
    """`demo --customers K` (harness/simulation's world): K masters with a sub-account each, keys for
    both, funded through the ledger, their withdrawals whitelisted; idempotent like the rest."""
    world = json.loads(run("demo", "--json", "--customers", "3"))
    assert len(world["customers"]) == 3
    for entry in world["customers"]:
        master = User.objects.get(email=entry["master"]["email"])
        sub = User.objects.get(email=entry["sub"]["email"])
        assert sub.master == master
        assert master.master is None
        for user, role in ((master, "master"), (sub, "sub")):
            assert ApiKey.objects.get(user=user, key=entry[role]["api_key"])
            funded = {b.asset.code: b.free for b in user.balances.select_related("asset")}
            assert funded == {code: Decimal(amount) for code, amount in CUSTOMER_FUNDING[role].items()}
        assert WhitelistAddress.objects.filter(account=master).count() == Network.objects.count()
    again = json.loads(run("demo", "--json", "--customers", "3"))
    assert again == world
    assert "customers" not in json.loads(run("demo", "--json"))
