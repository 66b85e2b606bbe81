"""API-key IP restrictions of a sub-account's key, managed by its master (issue 15, item 7): the
record, add (merge, keep order, no repeats, ipRestriction 1/2), delete, every refusal (a bad
address changes nothing, the 30-address cap, trusted IPs only with an empty list), every ownership
boundary (-1151 for any key that is not the named sub-account's, the same answer whoever has it;
-1152 for a sub-account calling), the gateway applying a change from the very next request
(-2017, and through again), and concurrent batches on one key losing nothing."""

from __future__ import annotations

import itertools
import threading
from urllib.parse import urlencode

import pytest
from django.db import connections

from accounts.models import ApiKey, ApiKeyType
from exchange.api.ratelimit import USED_UID_WEIGHT_HEADER, USED_WEIGHT_HEADER
from subaccounts import services
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error
from tests.support.client import SignedClient, hmac_hex, now_ms
from tests.support.factories import ApiKeyFactory, AssetFactory, customer

GET = "/openapi/v1/sub-account/apikey/ip-restriction"
ADD = "/openapi/v1/sub-account/apikey/add-ip-restriction"
DELETE = "/openapi/v1/sub-account/apikey/delete-ip-restriction"
FUNCTIONAL_ROLE = "2,3,4,5,6"
OUTSIDE = "203.0.113.5"  # the sub-account's client's address in the gateway tests


def _of(sub) -> dict:
    return {"apikey": sub.api_key.key, "email": sub.user.email}


def _stored(api_key: ApiKey) -> tuple:
    api_key.refresh_from_db()
    return api_key.ip_restrict, list(api_key.ip_list), api_key.updated_at


# --- the record -------------------------------------------------------------------------------------


def test_the_record_of_a_new_key(family):
    body = h.ok(family.master.client.get(GET, _of(family.sub1)))
    key = family.sub1.api_key
    key.refresh_from_db()
    assert body == {
        "apikey": key.key,
        "ipList": [],
        "ipRestrict": False,
        "role": FUNCTIONAL_ROLE,
        "updateTime": int(key.updated_at.timestamp() * 1000),
    }
    assert type(body["updateTime"]) is int


@pytest.mark.parametrize(
    ("types", "role"),
    [
        ([ApiKeyType.READ_ONLY], "0"),
        ([ApiKeyType.SPOT], "2"),
        ([ApiKeyType.FIAT, ApiKeyType.SPOT], "2,5"),
        ([ApiKeyType.ACCOUNT, ApiKeyType.CONVERT, ApiKeyType.CRYPTO_WALLET], "3,4,6"),
    ],
)
def test_role_lists_the_codes_of_the_keys_types(family, types, role):
    api_key, _ = ApiKeyFactory(user=family.sub2.user, types=types)
    body = h.ok(family.master.client.get(GET, {"apikey": api_key.key, "email": family.sub2.user.email}))
    assert body["role"] == role


def test_the_email_matches_in_any_case(family):
    params = {"apikey": family.sub1.api_key.key, "email": family.sub1.user.email.upper()}
    assert h.ok(family.master.client.get(GET, params))["apikey"] == family.sub1.api_key.key


# --- add ----------------------------------------------------------------------------------------------


def test_add_restricts_to_the_batch(family):
    body = h.ok(
        family.master.client.post(
            ADD, {**_of(family.sub1), "ipAddress": "198.51.100.7,10.1.0.0/16", "ipRestriction": 1}
        )
    )
    assert body["ipList"] == ["198.51.100.7", "10.1.0.0/16"]
    assert body["ipRestrict"] is True
    assert body["role"] == FUNCTIONAL_ROLE
    restrict, ips, updated = _stored(family.sub1.api_key)
    assert (restrict, ips) == (True, ["198.51.100.7", "10.1.0.0/16"])
    assert body["updateTime"] == int(updated.timestamp() * 1000)
    assert h.ok(family.master.client.get(GET, _of(family.sub1))) == body


def test_add_merges_keeps_order_and_drops_repeats(family):
    client = family.master.client
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1,2.2.2.2", "ipRestriction": "1"}))
    body = h.ok(
        client.post(
            ADD, {**_of(family.sub1), "ipAddress": " 3.3.3.3 , 1.1.1.1,3.3.3.3,,2001:DB8::1 ", "ipRestriction": "1"}
        )
    )
    assert body["ipList"] == ["1.1.1.1", "2.2.2.2", "3.3.3.3", "2001:db8::1"]


def test_addresses_are_kept_in_canonical_form(family):
    body = h.ok(
        family.master.client.post(
            ADD,
            {
                **_of(family.sub1),
                "ipAddress": "10.0.0.5/24,1.2.3.4/32,2001:0db8:0000::/32,::ffff:1.2.3.4",
                "ipRestriction": "1",
            },
        )
    )
    assert body["ipList"] == ["10.0.0.0/24", "1.2.3.4", "2001:db8::/32", "::ffff:102:304"]


def test_ip_restriction_2_keeps_the_list_and_lifts_the_restriction(family):
    client = family.master.client
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"}))
    body = h.ok(client.post(ADD, {**_of(family.sub1), "ipRestriction": "2"}))
    assert (body["ipRestrict"], body["ipList"]) == (False, ["1.1.1.1"])
    body = h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "2.2.2.2", "ipRestriction": "2"}))
    assert (body["ipRestrict"], body["ipList"]) == (False, ["1.1.1.1", "2.2.2.2"])
    body = h.ok(client.post(ADD, {**_of(family.sub1), "ipRestriction": "1"}))  # the list is there: fine
    assert (body["ipRestrict"], body["ipList"]) == (True, ["1.1.1.1", "2.2.2.2"])


def test_unrestricted_with_an_empty_list_is_allowed(family):
    body = h.ok(family.master.client.post(ADD, {**_of(family.sub1), "ipRestriction": "2"}))
    assert (body["ipRestrict"], body["ipList"]) == (False, [])


def test_trusted_ips_only_with_an_empty_list_is_refused(family):
    before = _stored(family.sub1.api_key)
    for params in ({"ipRestriction": "1"}, {"ipRestriction": "1", "ipAddress": " , ,"}):
        response = family.master.client.post(ADD, {**_of(family.sub1), **params})
        assert_error(response, -1025, 400, msg_contains="at least one address")
    assert _stored(family.sub1.api_key) == before


def test_an_add_that_changes_nothing_keeps_update_time(family):
    client = family.master.client
    first = h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"}))
    again = h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1/32", "ipRestriction": "1"}))
    assert again == first


@pytest.mark.parametrize(
    "bad",
    ["1.2.3", "300.1.1.1", "abc", "1.2.3.4/33", "2001:db8::g", "1.2.3.4:80", "1.2.3.4/24/8", "-1", "localhost"],
)
def test_one_bad_address_refuses_the_batch_and_changes_nothing(family, bad):
    client = family.master.client
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "9.9.9.9", "ipRestriction": "2"}))
    before = _stored(family.sub1.api_key)
    response = client.post(ADD, {**_of(family.sub1), "ipAddress": f"1.1.1.1,{bad},2.2.2.2", "ipRestriction": "1"})
    assert_error(response, -1025, 400, msg_contains=f"'{bad}'")
    assert _stored(family.sub1.api_key) == before


def test_a_bad_address_is_refused_before_ownership_is_looked_at(family, other_family):
    """A malformed parameter is -1025 whatever the key (it depends on the request alone)."""
    response = family.master.client.post(ADD, {**_of(other_family.sub1), "ipAddress": "nope", "ipRestriction": "1"})
    assert_error(response, -1025, 400)


@pytest.mark.parametrize("value", ["0", "3", "true", "12", "one"])
def test_ip_restriction_must_be_1_or_2(family, value):
    before = _stored(family.sub1.api_key)
    response = family.master.client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": value})
    assert_error(response, -1025, 400, msg_contains="ipRestriction")
    assert _stored(family.sub1.api_key) == before


@pytest.mark.parametrize("missing", ["apikey", "email", "ipRestriction"])
def test_add_required_parameters(family, missing):
    params = {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"}
    del params[missing]
    assert_error(family.master.client.post(ADD, params), -1105, 400, msg_contains=missing)


def test_at_most_30_addresses(family):
    client = family.master.client
    first = [f"10.0.0.{i}" for i in range(1, 30)]
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": ",".join(first), "ipRestriction": "1"}))
    before = _stored(family.sub1.api_key)
    response = client.post(ADD, {**_of(family.sub1), "ipAddress": "10.0.1.1,10.0.1.2", "ipRestriction": "1"})
    assert_error(response, -1025, 400, msg_contains=f"at most {services.MAX_IP_ADDRESSES}")
    assert _stored(family.sub1.api_key) == before
    body = h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "10.0.0.1,10.0.1.1", "ipRestriction": "1"}))
    assert len(body["ipList"]) == services.MAX_IP_ADDRESSES == 30
    response = client.post(ADD, {**_of(family.sub1), "ipAddress": "::1", "ipRestriction": "1"})
    assert_error(response, -1025, 400)


def test_31_addresses_in_one_batch_are_refused(family):
    batch = ",".join(f"10.0.0.{i}" for i in range(1, 32))
    response = family.master.client.post(ADD, {**_of(family.sub1), "ipAddress": batch, "ipRestriction": "1"})
    assert_error(response, -1025, 400)
    assert _stored(family.sub1.api_key)[1] == []


# --- delete --------------------------------------------------------------------------------------------


def test_delete_removes_the_batch_and_keeps_the_restriction(family):
    client = family.master.client
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1,2.2.2.2,10.1.0.0/16,::1", "ipRestriction": "1"}))
    body = h.ok(client.post(DELETE, {**_of(family.sub1), "ipAddress": "2.2.2.2,10.1.7.7/16,0:0::1"}))
    assert (body["ipRestrict"], body["ipList"]) == (True, ["1.1.1.1"])
    assert _stored(family.sub1.api_key)[:2] == (True, ["1.1.1.1"])


def test_delete_skips_addresses_not_in_the_list(family):
    client = family.master.client
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1,2.2.2.2", "ipRestriction": "2"}))
    before = _stored(family.sub1.api_key)
    body = h.ok(client.post(DELETE, {**_of(family.sub1), "ipAddress": "3.3.3.3"}))
    assert (body["ipRestrict"], body["ipList"]) == (False, ["1.1.1.1", "2.2.2.2"])
    assert _stored(family.sub1.api_key) == before  # updateTime too
    body = h.ok(client.post(DELETE, {**_of(family.sub1), "ipAddress": "3.3.3.3,2.2.2.2"}))
    assert body["ipList"] == ["1.1.1.1"]


@pytest.mark.parametrize(("ip_address", "code"), [(None, -1105), (",", -1025), ("1.1.1.1,bad", -1025)])
def test_delete_refusals_change_nothing(family, ip_address, code):
    client = family.master.client
    h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"}))
    before = _stored(family.sub1.api_key)
    params = _of(family.sub1) | ({"ipAddress": ip_address} if ip_address is not None else {})
    assert_error(client.post(DELETE, params), code, 400, msg_contains="ipAddress")
    assert _stored(family.sub1.api_key) == before


# --- who may ------------------------------------------------------------------------------------------


CALLS = [
    ("GET", GET, {}),
    ("POST", ADD, {"ipAddress": "1.1.1.1", "ipRestriction": "1"}),
    ("POST", DELETE, {"ipAddress": "1.1.1.1"}),
]


@pytest.fixture
def untouched(family, other_family):
    """Every key of both families, and its IP state, to show a refusal changed none of them."""
    keys = list(ApiKey.objects.filter(user__in=[c.user for c in (*_members(family), *_members(other_family))]))
    return {key.pk: (key.ip_restrict, list(key.ip_list), key.updated_at) for key in keys}


def _members(family):
    return (family.master, family.sub1, family.sub2)


def _unchanged(untouched: dict) -> bool:
    now = {
        key.pk: (key.ip_restrict, list(key.ip_list), key.updated_at) for key in ApiKey.objects.filter(pk__in=untouched)
    }
    return now == untouched


@pytest.mark.parametrize(("method", "path", "params"), CALLS)
def test_a_sub_account_cannot_call_them(family, untouched, method, path, params):
    for caller in (family.sub1, family.sub2):
        for target in (family.sub1, family.sub2):
            response = caller.client.request(method, path, {**_of(target), **params})
            assert_error(response, -1152, 401, msg_contains="master")
    assert _unchanged(untouched)


@pytest.mark.parametrize(("method", "path", "params"), CALLS)
def test_another_masters_sub_account_is_not_found(family, other_family, untouched, method, path, params):
    response = family.master.client.request(method, path, {**_of(other_family.sub1), **params})
    assert_error(response, -1151, 404)
    assert other_family.sub1.user.email in response.json()["msg"]
    assert _unchanged(untouched)


@pytest.mark.parametrize(("method", "path", "params"), CALLS)
def test_an_email_that_is_not_a_sub_account_is_not_found(family, other_family, untouched, method, path, params):
    for email in (family.master.user.email, other_family.master.user.email, "nobody@test.example"):
        response = family.master.client.request(
            method, path, {"apikey": family.master.api_key.key, "email": email, **params}
        )
        assert_error(response, -1151, 404)
    assert _unchanged(untouched)


@pytest.mark.parametrize(("method", "path", "params"), CALLS)
def test_a_key_that_is_not_the_sub_accounts_own_reveals_nothing(family, other_family, untouched, method, path, params):
    """The master's own key, a sibling's, another family's, an unrelated customer's, and no key at
    all: the same -1151 and the same message for each."""
    loner = customer(email="loner@test.example")
    not_the_subs = [
        family.master.api_key.key,
        family.sub2.api_key.key,
        other_family.sub1.api_key.key,
        other_family.master.api_key.key,
        loner.api_key.key,
        "x" * 64,
        family.sub1.api_key.key.swapcase(),  # keys are case sensitive
    ]
    messages = set()
    for apikey in not_the_subs:
        response = family.master.client.request(
            method, path, {"apikey": apikey, "email": family.sub1.user.email, **params}
        )
        messages.add(assert_error(response, -1151, 404)["msg"])
    assert len(messages) == 1
    assert _unchanged(untouched)


def test_an_unrelated_customer_has_no_sub_accounts(family, untouched):
    loner = customer(email="loner@test.example")
    for method, path, params in CALLS:
        response = loner.client.request(method, path, {**_of(family.sub1), **params})
        assert_error(response, -1151, 404)
    assert _unchanged(untouched)


def test_a_read_only_master_key_reads_but_cannot_change(family):
    read_only = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.READ_ONLY]))
    assert h.ok(read_only.get(GET, _of(family.sub1)))["apikey"] == family.sub1.api_key.key
    before = _stored(family.sub1.api_key)
    assert_error(read_only.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"}), -1020)
    assert_error(read_only.post(DELETE, {**_of(family.sub1), "ipAddress": "1.1.1.1"}), -1020)
    assert _stored(family.sub1.api_key) == before


def test_changing_needs_enable_account(family):
    without = [ApiKeyType.SPOT, ApiKeyType.CONVERT, ApiKeyType.CRYPTO_WALLET, ApiKeyType.FIAT]
    client = SignedClient.of(ApiKeyFactory(user=family.master.user, types=without))
    assert h.ok(client.get(GET, _of(family.sub1)))["ipRestrict"] is False
    before = _stored(family.sub1.api_key)
    add = client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"})
    assert_error(add, -2019, 401, msg_contains=ApiKeyType.ACCOUNT)
    assert_error(client.post(DELETE, {**_of(family.sub1), "ipAddress": "1.1.1.1"}), -2019, 401)
    assert _stored(family.sub1.api_key) == before
    only_account = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.ACCOUNT]))
    assert h.ok(only_account.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "1"}))[
        "ipRestrict"
    ]


@pytest.mark.parametrize(("method", "path", "params"), CALLS)
def test_every_call_is_signed(family, method, path, params):
    unsigned = family.master.client.request(method, path, {**_of(family.sub1), **params}, signature="0" * 64)
    assert_error(unsigned, -1022)
    assert_error(SignedClient(None, "x").request(method, path, params, api_key=None), -1002)


def test_weights(family):
    """UID 10 for the record, UID 30 for a change (spec); nothing on the IP."""
    client = SignedClient(family.master.api_key.key, family.master.secret, ip="192.0.2.200")
    responses = [
        client.get(GET, _of(family.sub1)),
        client.get(GET, _of(family.sub1)),
        client.post(ADD, {**_of(family.sub1), "ipAddress": "1.1.1.1", "ipRestriction": "2"}),
        client.post(DELETE, {**_of(family.sub1), "ipAddress": "1.1.1.1"}),
    ]
    for response in responses:
        h.ok(response)
    uid = [int(r[USED_UID_WEIGHT_HEADER]) for r in responses]
    assert [later - earlier for earlier, later in itertools.pairwise(uid)] == [10, 30, 30]
    assert len({r[USED_WEIGHT_HEADER] for r in responses}) == 1


# --- the official connector's requests ----------------------------------------------------------------


def _form_post(client: SignedClient, path: str, params: dict):
    """A POST with every parameter, timestamp included, in the form body (the signature in the
    query string), as a connector that sends `data=` does."""
    body = {**params, "timestamp": now_ms()}
    signature = hmac_hex(client.secret, urlencode(body))
    return client.client.post(
        f"{path}?signature={signature}",
        data=urlencode(body),
        content_type="application/x-www-form-urlencoded",
        headers={"X-SERVICE-APIKEY": client.api_key},
        REMOTE_ADDR=client.ip,
    )


def test_the_connectors_requests(family):
    """GET with the parameters in the query string; POST with them in the form body, and POST with
    them in the query string: the connector's parameter names, values as it sends them."""
    client = family.master.client
    record = h.ok(
        client.get(GET, {"apikey": family.sub1.api_key.key, "email": family.sub1.user.email, "recvWindow": 5000})
    )
    assert record["ipList"] == []
    body = h.ok(
        _form_post(
            client,
            ADD,
            {
                "apikey": family.sub1.api_key.key,
                "email": family.sub1.user.email,
                "ipAddress": "8.8.8.8,1.1.1.1",
                "ipRestriction": "1",
            },
        )
    )
    assert (body["ipRestrict"], body["ipList"]) == (True, ["8.8.8.8", "1.1.1.1"])
    body = h.ok(_form_post(client, DELETE, {**_of(family.sub1), "ipAddress": "1.1.1.1"}))
    assert body["ipList"] == ["8.8.8.8"]
    body = h.ok(client.post(ADD, {**_of(family.sub1), "ipAddress": "9.9.9.9", "ipRestriction": "2"}))
    assert (body["ipRestrict"], body["ipList"]) == (False, ["8.8.8.8", "9.9.9.9"])
    body = h.ok(client.post(DELETE, {**_of(family.sub1), "ipAddress": "8.8.8.8", "recvWindow": "60000"}))
    assert body["ipList"] == ["9.9.9.9"]
    # a JSON-ish mixed request: part in the query string, part in the body (the query string wins)
    body = h.ok(
        client.post(
            ADD, {"apikey": family.sub1.api_key.key, "ipRestriction": "1"}, body={"email": family.sub1.user.email}
        )
    )
    assert body["ipRestrict"] is True


# --- the gateway applies it from the very next request ------------------------------------------------


def _sub_request(family, ip: str):
    return family.sub1.client.get(h.SUB_HISTORY, ip=ip)


def _the_very_next_request_sees_each_change(family) -> None:
    master = family.master.client
    assert _sub_request(family, OUTSIDE).status_code == 200  # its keyring is cached now
    h.ok(master.post(ADD, {**_of(family.sub1), "ipAddress": "198.51.100.0/24,2001:db8::7", "ipRestriction": "1"}))
    assert_error(_sub_request(family, OUTSIDE), -2017, 401, msg_contains=OUTSIDE)
    assert _sub_request(family, "198.51.100.77").status_code == 200
    assert _sub_request(family, "2001:db8::7").status_code == 200
    assert_error(_sub_request(family, "2001:db8::8"), -2017, 401)
    # the other keys of the family are not affected
    assert family.sub2.client.get(h.SUB_HISTORY, ip=OUTSIDE).status_code == 200
    assert master.get(GET, _of(family.sub1), ip=OUTSIDE).status_code == 200
    # deleting the address it came from: refused from there at once
    h.ok(master.post(DELETE, {**_of(family.sub1), "ipAddress": "198.51.100.0/24"}))
    assert_error(_sub_request(family, "198.51.100.77"), -2017, 401)
    # deleting the last one leaves a restricted key without a list: -1023 from everywhere
    h.ok(master.post(DELETE, {**_of(family.sub1), "ipAddress": "2001:db8::7"}))
    assert_error(_sub_request(family, "2001:db8::7"), -1023, 401)
    # adding the address back
    h.ok(master.post(ADD, {**_of(family.sub1), "ipAddress": OUTSIDE, "ipRestriction": "1"}))
    assert _sub_request(family, OUTSIDE).status_code == 200
    assert_error(_sub_request(family, "198.51.100.77"), -2017, 401)
    # lifting the restriction lets every address through, on the very next request
    h.ok(master.post(ADD, {**_of(family.sub1), "ipRestriction": "2"}))
    assert _sub_request(family, "198.51.100.77").status_code == 200
    assert _sub_request(family, OUTSIDE).status_code == 200


def test_the_very_next_request_sees_each_change(family):
    _the_very_next_request_sees_each_change(family)


@pytest.mark.django_db(transaction=True)
def test_the_very_next_request_sees_each_change_committed_for_real(assets):
    """The same with real commits: the eviction on commit (the one every process hears) is what
    the next request meets."""
    _the_very_next_request_sees_each_change(h.family_of("real", master_funding={"BTC": "1"}, sub_funding={"BTC": "1"}))


# --- concurrent batches on one key ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_adds_and_deletes_lose_nothing():
    """12 masters' threads at once, each with its own connection and client: 8 add two addresses
    each, 4 delete one of the addresses that were there before. The row lock orders them; without
    it, the read-merge-write of one would overwrite another's."""
    AssetFactory(code="BTC")
    family = h.family_of("race-ip", master_funding={}, sub_funding={})
    before = [f"192.0.2.{i}" for i in range(1, 5)]
    services.sub_account_ip_restriction_add(
        master=family.master.user,
        email=family.sub1.user.email,
        apikey=family.sub1.api_key.key,
        ip_addresses=",".join(before),
        restrict=True,
    )
    count = 12
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def one(i: int) -> None:
        client = SignedClient(family.master.api_key.key, family.master.secret)
        try:
            barrier.wait()
            if i < 8:
                response = client.post(
                    ADD, {**_of(family.sub1), "ipAddress": f"10.{i}.0.1,10.{i}.0.2", "ipRestriction": "1"}
                )
            else:
                response = client.post(DELETE, {**_of(family.sub1), "ipAddress": before[i - 8]})
            results[i] = response.status_code
        except Exception as exc:  # noqa: BLE001 - reported by the test
            results[i] = exc
        finally:
            connections.close_all()

    pool = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
    assert not any(thread.is_alive() for thread in pool)
    assert results == [200] * count
    key = ApiKey.objects.get(pk=family.sub1.api_key.pk)
    assert key.ip_restrict is True
    assert sorted(key.ip_list) == sorted(f"10.{i}.0.{j}" for i in range(8) for j in (1, 2))
