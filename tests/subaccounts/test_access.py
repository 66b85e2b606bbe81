"""Who may call what (issue 15, item 1): master endpoints refuse a sub-account's key, sub-account
endpoints refuse a master's (both -1152); an e-mail that is not one of the caller's sub-accounts is
-1151, whoever it belongs to; every endpoint is signed; a read-only key cannot write (-1020)."""

from __future__ import annotations

import pytest

from accounts.models import ApiKeyType
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import ApiKeyFactory, customer

MASTER_CALLS = [
    ("GET", h.LIST, {}),
    ("POST", h.CREATE, {"accountName": "new-sub@test.example"}),
    ("GET", h.ASSET, {"email": "fam-sub2@test.example"}),
    ("POST", h.UNIVERSAL, {"toEmail": "fam-sub2@test.example", "asset": "BTC", "amount": "0.1"}),
    ("GET", h.UNIVERSAL_HISTORY, {}),
]
SUB_CALLS = [
    ("POST", h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1"}),
    ("GET", h.SUB_HISTORY, {}),
]


@pytest.mark.parametrize(("method", "path", "params"), MASTER_CALLS)
def test_master_endpoints_refuse_a_sub_accounts_key(family, method, path, params):
    response = family.sub1.client.request(method, path, params)
    assert_error(response, -1152, 401, msg_contains="master")


@pytest.mark.parametrize(("method", "path", "params"), SUB_CALLS)
def test_sub_account_endpoints_refuse_a_masters_key(family, method, path, params):
    response = family.master.client.request(method, path, params)
    assert_error(response, -1152, 401, msg_contains="sub-account")


@pytest.mark.parametrize(("method", "path", "params"), SUB_CALLS)
def test_sub_account_endpoints_refuse_an_unrelated_customers_key(assets, method, path, params):
    loner = customer(funding={"BTC": "1"})
    assert_error(loner.client.request(method, path, params), -1152, 401)


@pytest.mark.parametrize(("method", "path", "params"), MASTER_CALLS + SUB_CALLS)
def test_every_endpoint_is_signed(family, method, path, params):
    caller = family.sub1 if path in (h.SUB_TO_MASTER, h.SUB_HISTORY) else family.master
    unsigned = caller.client.request(method, path, params, signature="0" * 64)
    assert_error(unsigned, -1022)
    no_key = SignedClient(None, "x").request(method, path, params, api_key=None)
    assert_error(no_key, -1002)


@pytest.mark.parametrize(
    ("path", "params", "as_sub"),
    [
        (h.CREATE, {"accountName": "ro-sub@test.example"}, False),
        (h.UNIVERSAL, {"toEmail": "fam-sub2@test.example", "asset": "BTC", "amount": "0.1"}, False),
        (h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1"}, True),
    ],
)
def test_a_read_only_key_cannot_write(family, path, params, as_sub):
    owner = family.sub1.user if as_sub else family.master.user
    read_only = SignedClient.of(ApiKeyFactory(user=owner, types=[ApiKeyType.READ_ONLY]))
    assert_error(read_only.post(path, params), -1020)


def test_a_read_only_key_may_read(family):
    read_only = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.READ_ONLY]))
    assert h.ok(read_only.get(h.LIST))["total"] == 2


@pytest.mark.parametrize(
    ("method", "path", "params"),
    [
        ("GET", h.ASSET, {"email": "other-sub1@test.example"}),
        ("POST", h.UNIVERSAL, {"fromEmail": "other-sub1@test.example", "asset": "BTC", "amount": "0.1"}),
        ("POST", h.UNIVERSAL, {"toEmail": "other-sub1@test.example", "asset": "BTC", "amount": "0.1"}),
        ("GET", h.UNIVERSAL_HISTORY, {"fromEmail": "other-sub1@test.example"}),
        ("GET", h.UNIVERSAL_HISTORY, {"toEmail": "other-sub1@test.example"}),
    ],
)
def test_another_masters_sub_accounts_are_not_found(family, other_family, method, path, params):
    assert_error(family.master.client.request(method, path, params), -1151, 404)


def test_an_unrelated_user_or_a_master_is_not_a_sub_account(family, other_family):
    for email in (other_family.master.user.email, family.master.user.email):
        response = family.master.client.get(h.ASSET, {"email": email})
        assert_error(response, -1151, 404)


@pytest.mark.parametrize(
    ("method", "path", "params", "ip", "uid"),
    [
        ("GET", h.LIST, {}, 0, 10),
        ("POST", h.CREATE, {"accountName": "weighed@test.example"}, 60, 30),
        ("GET", h.ASSET, {"email": "fam-sub2@test.example"}, 0, 10),
        ("POST", h.UNIVERSAL, {"toEmail": "fam-sub2@test.example", "asset": "BTC", "amount": "0.1"}, 0, 100),
        ("GET", h.UNIVERSAL_HISTORY, {}, 0, 10),
    ],
)
def test_weights_as_the_spec_says(family, method, path, params, ip, uid):
    response = family.master.client.request(method, path, params)
    assert response.status_code == 200, response.content
    assert response["X-SERVICE-USED-WEIGHT-1M"] == str(ip)
    assert response["X-SERVICE-USED-UID-WEIGHT-1M"] == str(uid)


@pytest.mark.parametrize(
    ("method", "path", "params", "uid"),
    [("POST", h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1"}, 100), ("GET", h.SUB_HISTORY, {}, 10)],
)
def test_sub_account_weights(family, method, path, params, uid):
    response = family.sub1.client.request(method, path, params)
    assert response.status_code == 200, response.content
    assert response["X-SERVICE-USED-UID-WEIGHT-1M"] == str(uid)


def test_a_frozen_sub_accounts_key_is_refused(family):
    family.sub1.user.is_frozen = True
    family.sub1.user.save()
    assert_error(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1"}), -2015)
