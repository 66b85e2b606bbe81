"""The request gateway's refusals, one error code at a time, plus timing edges and the API key list.

Signed endpoint: GET /openapi/v1/api-keys (USER_DATA). Write-path checks use the test-only
endpoints below, routed by tests/exchange/gateway_test_urls.py.
"""

from __future__ import annotations

import time

import pytest
from django.test import Client
from rest_framework.response import Response

from accounts import services as account_services
from exchange.api import auth
from exchange.api.auth import Security
from exchange.api.params import Param, ParamSpec
from exchange.api.views import GatewayApi
from tests.support.assertions import assert_error
from tests.support.client import FORM, SignedClient, hmac_hex, now_ms

API_KEYS = "/openapi/v1/api-keys"
ECHO = "/openapi/test/echo"
CONVERT_ONLY = "/openapi/test/convert-only"
WHITELIST_REQUIRED = "/openapi/test/whitelist-required"
TEST_URLS = "tests.exchange.gateway_test_urls"
OTHER_SECRET = "s" * 64


# --- test-only endpoints ---------------------------------------------------------------------------


class EchoApi(GatewayApi):
    """USER_DATA, read (GET) and write (POST, PUT, DELETE): answers with the parsed parameters."""

    security = Security.USER_DATA
    params_spec = ParamSpec(
        (
            Param("a"),
            Param("b"),
            Param("email"),
            Param("note"),
            Param("amount", "DECIMAL"),
        )
    )

    def _echo(self, request):
        return Response(
            {
                "method": request.method,
                "params": {k: str(v) for k, v in self.params.items() if v is not None},
            }
        )

    def get(self, request):
        return self._echo(request)

    def post(self, request):
        return self._echo(request)

    def put(self, request):
        return self._echo(request)

    def delete(self, request):
        return self._echo(request)


class ConvertKeyApi(GatewayApi):
    """USER_DATA endpoint that needs the key type 'Enable Convert'."""

    security = Security.USER_DATA
    key_type = "Enable Convert"

    def get(self, request):
        return Response({"ok": True})

    def post(self, request):
        return Response({"ok": True})


class WhitelistRequiredApi(GatewayApi):
    """USER_DATA endpoint that only IP-restricted keys may use."""

    security = Security.USER_DATA
    ip_whitelist_required = True

    def get(self, request):
        return Response({"ok": True})


# --- helpers -----------------------------------------------------------------------------------------


def send(method, path, query="", body="", *, key=None, content_type=FORM, headers=None, ip="127.0.0.1"):
    """One request with the exact query and body text given (nothing added, nothing re-encoded)."""
    all_headers = {} if key is None else {"X-SERVICE-APIKEY": key}
    all_headers.update(headers or {})
    return Client().generic(
        method,
        f"{path}?{query}" if query else path,
        data=body,
        content_type=content_type,
        headers=all_headers,
        REMOTE_ADDR=ip,
    )


def with_signature(query: str, signature: str) -> str:
    return f"{query}&signature={signature}" if query else f"signature={signature}"


@pytest.fixture
def client_for(make_key):
    """A SignedClient for a fresh key of `user` (the key options are passed through)."""

    def make(user, **key_options):
        api_key, secret = make_key(user, **key_options)
        return SignedClient(api_key.key, secret), api_key, secret

    return make


# --- -1002 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_missing_api_key_header_is_1002(master_key):
    _, secret = master_key
    response = SignedClient(None, secret).get(API_KEYS)
    assert_error(response, -1002, 401)


@pytest.mark.django_db
def test_blank_api_key_header_is_1002(master_key):
    _, secret = master_key
    response = SignedClient("   ", secret).get(API_KEYS)
    assert_error(response, -1002, 401)


# --- -2018 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_unknown_api_key_is_2018(master_key):
    _, secret = master_key
    response = SignedClient("U" * 64, secret).get(API_KEYS)
    assert_error(response, -2018, 401)


@pytest.mark.django_db
def test_over_long_api_key_is_2018(master_key):
    api_key, secret = master_key
    response = SignedClient(api_key.key + "x", secret).get(API_KEYS)
    assert_error(response, -2018, 401)
    response = SignedClient("k" * 10_000, secret).get(API_KEYS)
    assert_error(response, -2018, 401)


@pytest.mark.django_db
def test_api_key_is_case_sensitive_2018(master_key):
    api_key, secret = master_key
    swapped = api_key.key.swapcase()
    assert swapped != api_key.key
    response = SignedClient(swapped, secret).get(API_KEYS)
    assert_error(response, -2018, 401)


@pytest.mark.django_db
def test_api_key_with_nul_character_is_2018_not_500(master_key):
    """A key the database cannot even store (NUL) is simply a key that does not exist."""
    api_key, secret = master_key
    response = SignedClient(api_key.key[:10] + "\x00" + api_key.key[11:], secret).get(API_KEYS)
    assert_error(response, -2018, 401)


# --- -2015 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_not_enabled_key_is_2015(master_key, signed_client):
    api_key, _ = master_key
    account_services.api_key_set_status(api_key=api_key, enabled=False)
    assert_error(signed_client.get(API_KEYS), -2015, 401)


@pytest.mark.django_db
def test_key_disabled_after_use_is_2015_at_once(master_key, signed_client):
    """The gateway caches keys: a change must still be seen by the very next request."""
    api_key, _ = master_key
    assert signed_client.get(API_KEYS).status_code == 200
    account_services.api_key_set_status(api_key=api_key, enabled=False)
    assert_error(signed_client.get(API_KEYS), -2015, 401)
    account_services.api_key_set_status(api_key=api_key, enabled=True)
    assert signed_client.get(API_KEYS).status_code == 200


@pytest.mark.django_db
def test_key_of_inactive_user_is_2015(master, signed_client):
    master.is_active = False
    master.save(update_fields=["is_active"])
    assert_error(signed_client.get(API_KEYS), -2015, 401)


@pytest.mark.django_db
def test_user_deactivated_after_use_is_2015_at_once(master, signed_client):
    assert signed_client.get(API_KEYS).status_code == 200
    master.is_active = False
    master.save(update_fields=["is_active"])
    assert_error(signed_client.get(API_KEYS), -2015, 401)


@pytest.mark.django_db
def test_key_deleted_after_use_is_2018_at_once(master_key, signed_client):
    api_key, _ = master_key
    assert signed_client.get(API_KEYS).status_code == 200
    api_key.delete()
    assert_error(signed_client.get(API_KEYS), -2018, 401)


@pytest.mark.django_db
def test_ip_restriction_set_after_use_is_2017_at_once(master_key, signed_client):
    api_key, _ = master_key
    assert signed_client.get(API_KEYS).status_code == 200
    account_services.api_key_set_ip_restriction(api_key=api_key, ip_restrict=True, ip_list=["10.9.9.9"])
    assert_error(signed_client.get(API_KEYS), -2017, 401)


@pytest.mark.django_db
def test_new_key_of_an_account_already_in_use_works(master, signed_client, make_key):
    assert signed_client.get(API_KEYS).status_code == 200
    new_key, new_secret = make_key(master, name="second")
    response = SignedClient(new_key.key, new_secret).get(API_KEYS)
    assert response.status_code == 200, response.content
    assert [item["apiName"] for item in response.json()] == ["master", "second"]
    # and the first key's listing shows the new key at once too
    assert [item["apiName"] for item in signed_client.get(API_KEYS).json()] == ["master", "second"]


# --- -1022 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_signature_with_another_secret_is_1022(signed_client):
    ts = now_ms()
    wrong = hmac_hex(OTHER_SECRET, f"timestamp={ts}")
    assert_error(signed_client.get(API_KEYS, timestamp=ts, signature=wrong), -1022, 401)


@pytest.mark.django_db
def test_non_hex_signature_is_1022(signed_client):
    assert_error(signed_client.get(API_KEYS, signature="z" * 64), -1022, 401)


@pytest.mark.django_db
def test_signature_of_wrong_length_is_1022(signed_client):
    ts = now_ms()
    good = hmac_hex(signed_client.secret, f"timestamp={ts}")
    assert_error(signed_client.get(API_KEYS, timestamp=ts, signature=good[:-1]), -1022, 401)
    assert_error(signed_client.get(API_KEYS, timestamp=ts, signature=good + "0"), -1022, 401)


@pytest.mark.django_db
def test_missing_signature_is_1022(signed_client):
    # signature="" makes SignedClient send no signature at all
    response = signed_client.get(API_KEYS, signature="")
    assert_error(response, -1022, 401)
    assert "signature" not in response.request["QUERY_STRING"]


@pytest.mark.django_db
def test_blank_signature_is_1022(signed_client, master_key):
    api_key, _ = master_key
    query = f"timestamp={now_ms()}&signature="
    assert_error(send("GET", API_KEYS, query, key=api_key.key), -1022, 401)


# --- -1021 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_timestamp_too_old_is_1021(signed_client):
    body = assert_error(signed_client.get(API_KEYS, timestamp=now_ms() - 60_000), -1021, 400)
    assert "behind" in body["msg"]


@pytest.mark.django_db
def test_timestamp_too_far_in_future_is_1021(signed_client):
    body = assert_error(signed_client.get(API_KEYS, timestamp=now_ms() + 60_000), -1021, 400)
    assert "ahead" in body["msg"]


# --- -1105 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_missing_timestamp_is_1105(signed_client):
    # timestamp=False: SignedClient adds no timestamp, the signature covers what is sent
    response = signed_client.get(API_KEYS, {"recvWindow": 5000}, timestamp=False)
    assert "timestamp" not in response.request["QUERY_STRING"]
    body = assert_error(response, -1105, 400)
    assert "timestamp" in body["msg"]


@pytest.mark.django_db
def test_blank_timestamp_is_missing_1105(master_key):
    api_key, secret = master_key
    query = "timestamp=&recvWindow=5000"
    response = send("GET", API_KEYS, with_signature(query, hmac_hex(secret, query)), key=api_key.key)
    assert_error(response, -1105, 400)


# --- -1025 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["abc", "1.5e12", "-1", "12 ", "0x10", "\uff11\uff12\uff13", "99999999999999999999"])
def test_timestamp_not_a_number_is_1025(signed_client, value):
    body = assert_error(signed_client.get(API_KEYS, timestamp=value), -1025, 400)
    assert "timestamp" in body["msg"]


@pytest.mark.django_db
def test_recv_window_above_60000_is_1025(signed_client):
    body = assert_error(signed_client.get(API_KEYS, {"recvWindow": 60001}), -1025, 400)
    assert "recvWindow" in body["msg"]


@pytest.mark.django_db
def test_recv_window_zero_is_1025(signed_client):
    body = assert_error(signed_client.get(API_KEYS, {"recvWindow": 0}), -1025, 400)
    assert "recvWindow" in body["msg"]


@pytest.mark.django_db
def test_recv_window_not_a_number_is_1025(signed_client):
    assert_error(signed_client.get(API_KEYS, {"recvWindow": "5s"}), -1025, 400)


@pytest.mark.django_db
def test_recv_window_60000_accepted(signed_client, master_key):
    response = signed_client.get(API_KEYS, {"recvWindow": 60000})
    assert response.status_code == 200, response.content
    assert [item["apiKey"] for item in response.json()] == [master_key[0].key]


# --- -1020 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_read_only_key_on_write_is_1020(master, client_for, method):
    client, _, _ = client_for(master, types=["Read only"])
    assert_error(client.request(method, ECHO, {"a": "1"}), -1020, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_read_only_key_may_read(master, client_for):
    client, _, _ = client_for(master, types=["Read only"])
    response = client.get(ECHO, {"a": "1"})
    assert response.status_code == 200, response.content
    assert response.json() == {"method": "GET", "params": {"a": "1"}}
    assert client.get(API_KEYS).status_code == 200


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_key_made_read_only_after_use_is_1020_at_once(master, client_for):
    client, api_key, _ = client_for(master, types=["Enable Spot"])
    assert client.post(ECHO, {"a": "1"}).status_code == 200
    api_key.types = ["Read only"]
    api_key.save(update_fields=["types"])
    assert_error(client.post(ECHO, {"a": "1"}), -1020, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_functional_key_may_write(master, client_for):
    client, _, _ = client_for(master, types=["Enable Spot"])
    response = client.post(ECHO, {"a": "1"})
    assert response.status_code == 200, response.content
    assert response.json() == {"method": "POST", "params": {"a": "1"}}


# --- -2019 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_key_without_required_type_is_2019(master, client_for):
    client, _, _ = client_for(master, types=["Enable Spot", "Enable Fiat"])
    body = assert_error(client.get(CONVERT_ONLY), -2019, 401)
    assert "Enable Convert" in body["msg"]


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_read_only_key_on_typed_read_endpoint_is_2019(master, client_for):
    client, _, _ = client_for(master, types=["Read only"])
    assert_error(client.get(CONVERT_ONLY), -2019, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_key_with_required_type_passes(master, client_for):
    client, _, _ = client_for(master, types=["Enable Convert"])
    assert client.get(CONVERT_ONLY).json() == {"ok": True}
    default_client, _, _ = client_for(master)  # no types chosen: every functional type
    assert default_client.post(CONVERT_ONLY).json() == {"ok": True}


# --- -2017 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_ip_not_in_list_is_2017(master, client_for):
    client, _, _ = client_for(master, ip_list=["10.1.2.3", "192.168.0.0/16"])
    body = assert_error(client.get(API_KEYS, ip="127.0.0.1"), -2017, 401)
    assert "127.0.0.1" in body["msg"]


@pytest.mark.django_db
def test_forwarded_for_header_is_not_believed_without_trusted_proxy(master, client_for):
    client, _, _ = client_for(master, ip_list=["10.1.2.3"])
    response = client.get(API_KEYS, ip="127.0.0.1", headers={"X-Forwarded-For": "10.1.2.3"})
    assert_error(response, -2017, 401)


@pytest.mark.django_db
def test_cidr_entry_containing_caller_passes(master, client_for):
    client, api_key, _ = client_for(master, ip_list=["10.1.2.3", "127.0.0.0/24"])
    response = client.get(API_KEYS, ip="127.0.0.77")
    assert response.status_code == 200, response.content
    assert [item["apiKey"] for item in response.json()] == [api_key.key]
    assert_error(client.get(API_KEYS, ip="127.0.1.1"), -2017, 401)


@pytest.mark.django_db
def test_ipv6_cidr_entry(master, client_for):
    client, _, _ = client_for(master, ip_list=["2001:db8::/32"])
    assert client.get(API_KEYS, ip="2001:db8::5").status_code == 200
    assert_error(client.get(API_KEYS, ip="2001:db9::5"), -2017, 401)


@pytest.mark.django_db
def test_ipv4_mapped_ipv6_peer_matches_its_ipv4_entry(master, client_for):
    """A dual-stack listener reports an IPv4 client as ::ffff:a.b.c.d; it is still that IPv4 address."""
    client, _, _ = client_for(master, ip_list=["203.0.113.7"])
    assert client.get(API_KEYS, ip="203.0.113.7").status_code == 200
    response = client.get(API_KEYS, ip="::ffff:203.0.113.7")
    assert response.status_code == 200, response.content
    assert_error(client.get(API_KEYS, ip="::ffff:203.0.113.8"), -2017, 401)


# --- -1023 --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_ip_restrict_with_empty_list_is_1023(master, client_for):
    client, api_key, _ = client_for(master, ip_restrict=True, ip_list=[])
    assert api_key.ip_restrict is True
    assert api_key.ip_list == []
    assert_error(client.get(API_KEYS), -1023, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_whitelist_required_endpoint_with_unrestricted_key_is_1023(master, client_for):
    client, _, _ = client_for(master)
    assert_error(client.get(WHITELIST_REQUIRED), -1023, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_whitelist_required_endpoint_with_restricted_key_passes(master, client_for):
    client, _, _ = client_for(master, ip_list=["127.0.0.1"])
    response = client.get(WHITELIST_REQUIRED)
    assert response.status_code == 200, response.content
    assert response.json() == {"ok": True}


# --- -1010: 404, 405, malformed bodies ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_openapi_path_is_json_404(method):
    response = send(method, "/openapi/v1/no-such-endpoint", "timestamp=1")
    assert response["Content-Type"].startswith("application/json")
    assert_error(response, -1010, 404)


@pytest.mark.django_db
def test_unknown_openapi_path_with_trailing_slash_is_json_404():
    response = send("GET", "/openapi/v1/ping/")
    assert response["Content-Type"].startswith("application/json")
    assert_error(response, -1010, 404)


@pytest.mark.django_db
def test_post_on_ping_is_405_without_key():
    response = send("POST", "/openapi/v1/ping")
    assert_error(response, -1010, 405)


@pytest.mark.django_db
def test_delete_on_api_keys_is_405_without_key():
    response = send("DELETE", API_KEYS)
    assert_error(response, -1010, 405)


@pytest.mark.django_db
def test_delete_on_api_keys_is_405_with_a_valid_signed_request(signed_client):
    assert_error(signed_client.delete(API_KEYS), -1010, 405)


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["PATCH", "OPTIONS"])
def test_undeclared_methods_are_405(method):
    assert_error(send(method, "/openapi/v1/ping"), -1010, 405)
    assert_error(send(method, API_KEYS), -1010, 405)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_invalid_utf8_body_is_1010(master_key):
    api_key, _ = master_key
    response = send("POST", ECHO, body=b"a=\xff\xfe&timestamp=1", key=api_key.key)
    assert_error(response, -1010, 400)


@pytest.mark.django_db
def test_invalid_utf8_body_on_get_without_key_is_1010():
    response = send("GET", API_KEYS, body=b"\xc3\x28")
    assert_error(response, -1010, 400)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
@pytest.mark.parametrize("body", ["[1, 2]", '{"a": [1]}', '{"a": {"b": 1}}', "{not json", '"text"'])
def test_json_body_that_is_not_an_object_of_scalars_is_1010(master_key, body):
    api_key, _ = master_key
    response = send("POST", ECHO, body=body, key=api_key.key, content_type="application/json")
    assert_error(response, -1010, 400)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
@pytest.mark.parametrize("content_type", ["text/xml", "application/xml", "multipart/form-data; boundary=x"])
def test_unsupported_content_type_is_1010(master_key, content_type):
    api_key, _ = master_key
    response = send("POST", ECHO, body="<a>1</a>", key=api_key.key, content_type=content_type)
    assert_error(response, -1010, 400)


# --- timing at both edges (deterministic server clock) -------------------------------------------------

FIXED_NOW = 1_750_000_000_000


@pytest.fixture
def frozen_server_time(monkeypatch):
    monkeypatch.setattr(auth, "server_time_ms", lambda: FIXED_NOW)
    return FIXED_NOW


@pytest.mark.django_db
def test_timestamp_999ms_ahead_accepted(signed_client, frozen_server_time):
    response = signed_client.get(API_KEYS, timestamp=frozen_server_time + 999)
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_timestamp_1000ms_ahead_refused(signed_client, frozen_server_time):
    body = assert_error(signed_client.get(API_KEYS, timestamp=frozen_server_time + 1000), -1021, 400)
    assert "ahead" in body["msg"]
    assert "1000ms" in body["msg"]


@pytest.mark.django_db
@pytest.mark.parametrize("recv_window", [None, 1, 5000, 60000])
def test_timestamp_exactly_recv_window_behind_accepted(signed_client, frozen_server_time, recv_window):
    params = {} if recv_window is None else {"recvWindow": recv_window}
    window = recv_window or 5000
    response = signed_client.get(API_KEYS, params, timestamp=frozen_server_time - window)
    assert response.status_code == 200, response.content


@pytest.mark.django_db
@pytest.mark.parametrize("recv_window", [None, 1, 5000, 60000])
def test_timestamp_recv_window_plus_one_behind_refused(signed_client, frozen_server_time, recv_window):
    params = {} if recv_window is None else {"recvWindow": recv_window}
    window = recv_window or 5000
    response = signed_client.get(API_KEYS, params, timestamp=frozen_server_time - window - 1)
    body = assert_error(response, -1021, 400)
    assert "behind" in body["msg"]
    assert f"{window + 1}ms" in body["msg"]


# --- GET /openapi/v1/api-keys: own keys only, exact fields, never the secret -----------------------------

API_KEY_FIELDS = {"apiKey", "apiName", "apiType", "status", "createTime", "ipAccessRestrictions"}


@pytest.mark.django_db
def test_sub_account_key_sees_only_its_own_keys(master, master_key, make_user, make_key):
    sub = make_user(master=master)
    before = int(time.time() * 1000)
    sub_key, sub_secret = make_key(sub, name="sub main", types=["Enable Spot", "Enable Convert"])
    sub_key2, sub_secret2 = make_key(sub, name="sub ro", types=["Read only"], ip_list=["203.0.113.7", "10.0.0.0/8"])
    after = int(time.time() * 1000)
    other = make_user()
    other_key, other_secret = make_key(other, name="other")

    response = SignedClient(sub_key.key, sub_secret).get(API_KEYS)
    assert response.status_code == 200, response.content
    items = response.json()
    assert [item["apiKey"] for item in items] == [sub_key.key, sub_key2.key]
    for item in items:
        assert set(item) == API_KEY_FIELDS
        assert isinstance(item["apiType"], list)
        assert isinstance(item["ipAccessRestrictions"], list)
        assert isinstance(item["createTime"], str)
        assert item["createTime"].isdigit()
        assert before - 1000 <= int(item["createTime"]) <= after + 1000
    first, second = items
    assert first == {
        "apiKey": sub_key.key,
        "apiName": "sub main",
        "apiType": ["Enable Spot", "Enable Convert"],
        "status": "ENABLE",
        "createTime": first["createTime"],
        "ipAccessRestrictions": [],
    }
    assert second["apiName"] == "sub ro"
    assert second["apiType"] == ["Read only"]
    assert second["ipAccessRestrictions"] == ["203.0.113.7", "10.0.0.0/8"]

    text = response.content.decode()
    for secret in (sub_secret, sub_secret2, other_secret, master_key[1]):
        assert secret not in text
    for foreign in (master_key[0].key, other_key.key):
        assert foreign not in text


@pytest.mark.django_db
def test_master_key_does_not_see_sub_account_keys(master, master_key, make_user, make_key, signed_client):
    sub = make_user(master=master)
    sub_key, _ = make_key(sub)
    response = signed_client.get(API_KEYS)
    assert response.status_code == 200
    assert [item["apiKey"] for item in response.json()] == [master_key[0].key]
    assert sub_key.key not in response.content.decode()


@pytest.mark.django_db
def test_secret_never_appears_in_error_bodies(master_key, signed_client):
    _, secret = master_key
    responses = [
        signed_client.get(API_KEYS, signature="0" * 64),
        signed_client.get(API_KEYS, timestamp=now_ms() - 100_000),
        signed_client.get(API_KEYS, {"recvWindow": 0}),
        signed_client.delete(API_KEYS),
        signed_client.get(API_KEYS),
    ]
    assert [r.status_code for r in responses] == [401, 400, 400, 405, 200]
    for response in responses:
        assert secret not in response.content.decode()
