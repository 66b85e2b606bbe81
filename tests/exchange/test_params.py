"""Parameter rules: merge (query wins), blanks absent, unknown ignored, typed parsing, unsigned
endpoints ignoring signing garbage, and malformed input never becoming a 500."""

from __future__ import annotations

from decimal import Decimal

import pytest

from exchange.api import auth
from exchange.api.errors import ExchangeError
from exchange.api.params import RECV_WINDOW, TIMESTAMP, Param, ParamSpec, merge_params
from tests.exchange.test_gateway_auth import TEST_URLS, send, with_signature
from tests.support.assertions import assert_error
from tests.support.client import hmac_hex, now_ms

API_KEYS = "/openapi/v1/api-keys"
ECHO = "/openapi/test/echo"
SYS_STATUS = "/openapi/v1/check-sys-status"
GARBAGE = "timestamp=abc&signature=zz-not-hex&recvWindow=-5"


@pytest.fixture
def key_and_secret(master_key):
    api_key, secret = master_key
    return api_key.key, secret


def signed(secret: str, query: str, body: str = "") -> str:
    return with_signature(query, hmac_hex(secret, query + body))


def echo_params(response) -> dict:
    assert response.status_code == 200, response.content
    return response.json()["params"]


def refusal(code: int, status: int, callable_, *args):
    with pytest.raises(ExchangeError) as caught:
        callable_(*args)
    assert caught.value.code == code
    assert caught.value.http_status == status
    return caught.value


# --- blanks and unknown parameters through the gateway ---------------------------------------------------


@pytest.mark.django_db
def test_empty_recv_window_is_absent(key_and_secret):
    key, secret = key_and_secret
    query = f"recvWindow=&timestamp={now_ms()}"
    response = send("GET", API_KEYS, signed(secret, query), key=key)
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_valueless_recv_window_is_absent(key_and_secret):
    key, secret = key_and_secret
    query = f"&recvWindow&timestamp={now_ms()}&"
    response = send("GET", API_KEYS, signed(secret, query), key=key)
    assert response.status_code == 200, response.content


@pytest.mark.django_db
@pytest.mark.parametrize("blank", ["recvWindow=&", "&recvWindow&"])
def test_blank_recv_window_means_the_default_window(key_and_secret, monkeypatch, blank):
    """Absent, not zero and not the maximum: the default 5000 ms applies."""
    key, secret = key_and_secret
    fixed = 1_750_000_000_000
    monkeypatch.setattr(auth, "server_time_ms", lambda: fixed)
    ok = f"{blank}timestamp={fixed - 5000}"
    assert send("GET", API_KEYS, signed(secret, ok), key=key).status_code == 200
    late = f"{blank}timestamp={fixed - 5001}"
    assert_error(send("GET", API_KEYS, signed(secret, late), key=key), -1021, 400)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_blank_and_valueless_params_are_absent_in_the_handler(key_and_secret):
    key, secret = key_and_secret
    query = f"a=&b&note=x&amount=&timestamp={now_ms()}"
    assert echo_params(send("GET", ECHO, signed(secret, query), key=key)) == {"note": "x"}


@pytest.mark.django_db
def test_unknown_params_ignored(key_and_secret):
    key, secret = key_and_secret
    query = f"recv_window=abc&RECVWINDOW=0&recvwindow=99999999&foo=&timestamp={now_ms()}"
    response = send("GET", API_KEYS, signed(secret, query), key=key)
    assert response.status_code == 200, response.content
    assert [item["apiKey"] for item in response.json()] == [key]


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_unknown_params_not_passed_to_handler(key_and_secret):
    key, secret = key_and_secret
    query = f"a=1&zzz=2&recv_window=3&timestamp={now_ms()}"
    assert echo_params(send("GET", ECHO, signed(secret, query), key=key)) == {"a": "1"}


# --- query string wins over the body -----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_query_wins_over_body_for_a_duplicate(key_and_secret):
    key, secret = key_and_secret
    query = f"a=from-query&timestamp={now_ms()}"
    body = "a=from-body&b=only-body"
    response = send("POST", ECHO, signed(secret, query, body), body=body, key=key)
    assert echo_params(response) == {"a": "from-query", "b": "only-body"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_query_timestamp_and_recv_window_win_over_body(key_and_secret):
    key, secret = key_and_secret
    query = f"recvWindow=60000&timestamp={now_ms()}"
    body = "recvWindow=0&timestamp=garbage"
    response = send("POST", ECHO, signed(secret, query, body), body=body, key=key)
    assert echo_params(response) == {}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_blank_query_value_lets_the_body_value_through(key_and_secret):
    """A blank parameter is absent, so it cannot shadow the body's value."""
    key, secret = key_and_secret
    query = f"a=&timestamp={now_ms()}"
    body = "a=from-body"
    response = send("POST", ECHO, signed(secret, query, body), body=body, key=key)
    assert echo_params(response) == {"a": "from-body"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_decimal_param_through_the_gateway(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    response = send("POST", ECHO, signed(secret, f"amount=0.1&timestamp={ts}"), key=key)
    assert echo_params(response) == {"amount": "0.1"}
    body = assert_error(send("POST", ECHO, signed(secret, f"amount=1e5&timestamp={ts}"), key=key), -1025, 400)
    assert "amount" in body["msg"]


# --- unsigned endpoints ignore signing parameters ---------------------------------------------------------


@pytest.mark.django_db
def test_ping_ignores_timestamp_and_signature_garbage():
    response = send("GET", "/openapi/v1/ping", GARBAGE, headers={"X-SERVICE-APIKEY": "nonsense"})
    assert response.status_code == 200, response.content
    assert response.json() == {}


@pytest.mark.django_db
def test_time_ignores_timestamp_and_signature_garbage():
    before = now_ms()
    response = send("GET", "/openapi/v1/time", GARBAGE)
    after = now_ms()
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"serverTime"}
    assert isinstance(body["serverTime"], int)
    assert before - 5 <= body["serverTime"] <= after + 5


@pytest.mark.django_db
def test_check_sys_status_ignores_timestamp_and_signature_garbage():
    response = send("GET", SYS_STATUS, GARBAGE)
    assert response.status_code == 200, response.content
    assert response.json() == [
        {"businessType": "SPOT", "businessStatus": "on"},
        {"businessType": "CONVERT", "businessStatus": "on"},
    ]


@pytest.mark.django_db
def test_check_sys_status_one_business_type():
    response = send("GET", SYS_STATUS, "businessType=SPOT")
    assert response.status_code == 200, response.content
    assert response.json() == [{"businessType": "SPOT", "businessStatus": "on"}]
    response = send("GET", SYS_STATUS, "businessType=CONVERT")
    assert response.json() == [{"businessType": "CONVERT", "businessStatus": "on"}]


@pytest.mark.django_db
def test_check_sys_status_blank_business_type_means_all():
    response = send("GET", SYS_STATUS, "businessType=")
    assert response.status_code == 200, response.content
    assert [item["businessType"] for item in response.json()] == ["SPOT", "CONVERT"]


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["FUTURES", "spot", "SPOT%20", "SPOT,CONVERT"])
def test_check_sys_status_invalid_business_type_is_1025(value):
    body = assert_error(send("GET", SYS_STATUS, f"businessType={value}"), -1025, 400)
    assert "businessType" in body["msg"]


# --- malformed input is never a 500 ---------------------------------------------------------------


@pytest.mark.django_db
def test_query_with_many_fields_is_1010_not_500():
    """600 fields: more than the gateway's own parse limit (500), fewer than Django's (1000)."""
    query = "&".join(f"p{i}=1" for i in range(600))
    assert_error(send("GET", "/openapi/v1/ping", query), -1010, 400)


@pytest.mark.django_db
def test_query_with_very_many_fields_is_1010():
    query = "&".join(f"{i:x}=1" for i in range(600))  # 600 fields (MAX_FIELDS 500) in under 8 KB
    assert len(query) < 8 * 1024
    assert_error(send("GET", "/openapi/v1/ping", query), -1010, 400)
    # Longer than the query bound (API_MAX_QUERY_BYTES): refused for its size first (414).
    query = "&".join(f"p{i}=1" for i in range(1500))
    assert_error(send("GET", "/openapi/v1/ping", query), -1010, 414)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_body_with_many_fields_is_1010(key_and_secret):
    key, _ = key_and_secret
    body = "&".join(f"p{i}=1" for i in range(600))
    assert_error(send("POST", ECHO, body=body, key=key), -1010, 400)


@pytest.mark.django_db
def test_invalid_percent_escapes_in_query_do_not_break_unsigned_endpoints():
    response = send("GET", "/openapi/v1/ping", "a=%ff%fe&b=%zz&c=%")
    assert response.status_code == 200, response.content
    assert response.json() == {}


@pytest.mark.django_db
def test_invalid_percent_escapes_in_signed_query_verify_over_the_sent_text(key_and_secret):
    key, secret = key_and_secret
    query = f"note=%ff%zz&timestamp={now_ms()}"
    response = send("GET", API_KEYS, signed(secret, query), key=key)
    assert response.status_code == 200, response.content


# --- ParamSpec and Param units ---------------------------------------------------------------------------


def test_required_param_missing_is_1105():
    spec = ParamSpec((Param("tokenId", required=True), Param("page", "INT", default=1)))
    error = refusal(-1105, 400, spec.parse, {"page": "2"})
    assert "tokenId" in error.msg


def test_timestamp_param_missing_is_1105():
    error = refusal(-1105, 400, TIMESTAMP.parse_missing)
    assert "timestamp" in error.msg


def test_optional_param_missing_gets_default():
    spec = ParamSpec((Param("page", "INT", default=1), Param("tokenId")))
    assert spec.parse({}) == {"page": 1, "tokenId": None}
    assert RECV_WINDOW.parse_missing() == 5000


@pytest.mark.parametrize("raw", ["abc", "1.0", " 1", "1 ", "+1", "1e3", "0x10", "\uff11", "\u0661", "1_000", "", "--1"])
def test_int_invalid_is_1025(raw):
    error = refusal(-1025, 400, Param("page", "INT").parse, raw)
    assert "page" in error.msg


@pytest.mark.parametrize(("raw", "expected"), [("0", 0), ("-5", -5), ("1499827319559", 1499827319559)])
def test_int_valid(raw, expected):
    value = Param("n", "LONG").parse(raw)
    assert value == expected
    assert type(value) is int


@pytest.mark.parametrize("raw", ["0", "1001"])
def test_int_out_of_bounds_is_1025(raw):
    refusal(-1025, 400, Param("pageNum", "INT", min=1, max=1000).parse, raw)


def test_int_bounds_inclusive():
    param = Param("pageNum", "INT", min=1, max=1000)
    assert param.parse("1") == 1
    assert param.parse("1000") == 1000


@pytest.mark.parametrize("raw", ["0", "60001", "-1"])
def test_recv_window_bounds_are_1025(raw):
    refusal(-1025, 400, RECV_WINDOW.parse, raw)


def test_conflicting_params_are_1107():
    spec = ParamSpec((Param("from_address"), Param("to_address")), conflicts=(("from_address", "to_address"),))
    error = refusal(-1107, 400, spec.parse, {"from_address": "a", "to_address": "b"})
    assert "from_address" in error.msg
    assert spec.parse({"from_address": "a"}) == {"from_address": "a", "to_address": None}


def test_param_sent_when_not_required_is_1106():
    spec = ParamSpec((Param("price", "DECIMAL"), Param("type")), requires=(("price", "type"),))
    error = refusal(-1106, 400, spec.parse, {"price": "1"})
    assert "price" in error.msg
    assert spec.parse({"price": "1", "type": "LIMIT"}) == {"price": Decimal("1"), "type": "LIMIT"}


@pytest.mark.parametrize(
    "raw",
    [
        "0.1",
        "0",
        "1.10",
        "00012.5",
        "0.30000000000000004",
        "999999999999999999.999999999999999999",
        "123456789012345678.123456789012345678000000000000",
    ],
)
def test_decimal_parsed_from_text_never_through_float(raw):
    value = Param("amount", "DECIMAL").parse(raw)
    assert type(value) is Decimal
    # the same digits and exponent as the text (trailing zeros and all 48 digits kept)
    assert value.as_tuple() == Decimal(raw).as_tuple()


def test_decimal_point_one_is_exact():
    value = Param("amount", "DECIMAL").parse("0.1")
    assert value == Decimal("0.1")
    assert value.as_tuple() == Decimal("0.1").as_tuple()
    assert value != Decimal.from_float(0.1)  # what going through float would give
    assert value * 3 == Decimal("0.3")


@pytest.mark.parametrize(
    "raw",
    [
        "1e5",
        "1E5",
        "-1",
        "1.",
        " 1",
        "1 ",
        ".5",
        "1,5",
        "NaN",
        "nan",
        "Infinity",
        "inf",
        "+1",
        "0x1",
        "\uff11",
        "1_0",
        "",
    ],
)
def test_decimal_invalid_is_1025(raw):
    error = refusal(-1025, 400, Param("amount", "DECIMAL").parse, raw)
    assert "amount" in error.msg


def test_decimal_bounds():
    param = Param("amount", "DECIMAL", min=Decimal("0.01"), max=Decimal("100"))
    assert param.parse("0.01") == Decimal("0.01")
    assert param.parse("100.000") == Decimal("100")
    refusal(-1025, 400, param.parse, "0.009")
    refusal(-1025, 400, param.parse, "100.0001")


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("false", False), ("TRUE", True), ("False", False)])
def test_bool_valid(raw, expected):
    assert Param("flag", "BOOL").parse(raw) is expected


@pytest.mark.parametrize("raw", ["1", "0", "yes", "t", ""])
def test_bool_invalid_is_1025(raw):
    refusal(-1025, 400, Param("flag", "BOOL").parse, raw)


def test_enum_is_exact():
    param = Param("businessType", "ENUM", choices=("SPOT", "CONVERT"))
    assert param.parse("SPOT") == "SPOT"
    refusal(-1025, 400, param.parse, "spot")
    refusal(-1025, 400, param.parse, "SPOT ")


def test_string_max_length():
    param = Param("client_transfer_id", max_length=100)
    assert param.parse("x" * 100) == "x" * 100
    refusal(-1025, 400, param.parse, "x" * 101)


# --- merge_params unit ---------------------------------------------------------------------------------


def test_merge_query_wins_blanks_absent():
    merged = merge_params("a=1&b=&c&d=q", "a=2&b=2&c=3&d=&e=5")
    assert merged == {"a": "1", "b": "2", "c": "3", "d": "q", "e": "5"}


def test_merge_decodes_percent_and_plus():
    assert merge_params("email=a%40b.com&note=x+y%2Bz", "") == {"email": "a@b.com", "note": "x y+z"}


# --- JSON bodies follow the same parsing rules ----------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_json_body_decimal_is_parsed_from_the_text_not_through_float(key_and_secret):
    """The JSON convenience body must not turn numbers into floats: 123456789.123456789 as a float
    is 123456789.12345679, a different amount."""
    key, secret = key_and_secret
    body = f'{{"amount": 123456789.123456789, "timestamp": {now_ms()}}}'
    response = send("POST", ECHO, signed(secret, "", body), body=body, key=key, content_type="application/json")
    assert echo_params(response) == {"amount": "123456789.123456789"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_json_body_exponent_number_is_1025_like_in_a_form(key_and_secret):
    key, secret = key_and_secret
    body = f'{{"amount": 1e5, "timestamp": {now_ms()}}}'
    response = send("POST", ECHO, signed(secret, "", body), body=body, key=key, content_type="application/json")
    assert_error(response, -1025, 400)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_json_body_string_values(key_and_secret):
    key, secret = key_and_secret
    body = f'{{"a": "x y", "amount": "0.10", "b": null, "timestamp": "{now_ms()}"}}'
    response = send("POST", ECHO, signed(secret, "", body), body=body, key=key, content_type="application/json")
    assert echo_params(response) == {"a": "x y", "amount": "0.10"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_body_too_large_is_1010(key_and_secret):
    key, _ = key_and_secret
    body = "note=" + "x" * (3 * 1024 * 1024)
    assert_error(send("POST", ECHO, body=body, key=key), -1010, 413)  # over API_MAX_BODY_BYTES
