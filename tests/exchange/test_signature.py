"""Signature vectors, the parameter-smuggling defence and a property test of the signing rules.

totalParams = raw query string immediately followed by the raw body (no '&' between them), with the
signature pair removed; hex HMAC-SHA256 keyed with the secret, case-insensitive. The percent-decoded
text is accepted too, but only when decoding cannot change how the text splits into parameters.
"""

from __future__ import annotations

import hashlib
import hmac
import string
from urllib.parse import parse_qsl, quote_plus, unquote_plus, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exchange.api import ratelimit
from exchange.api.signing import sign
from tests.exchange.test_gateway_auth import TEST_URLS, send, with_signature
from tests.support.assertions import assert_error
from tests.support.client import hmac_hex, now_ms

API_KEYS = "/openapi/v1/api-keys"
ECHO = "/openapi/test/echo"


def echo_params(response) -> dict:
    assert response.status_code == 200, response.content
    return response.json()["params"]


@pytest.fixture
def key_and_secret(master_key):
    api_key, secret = master_key
    return api_key.key, secret


# --- the HMAC itself ----------------------------------------------------------------------------------


def test_known_fixed_vector():
    """The published example: secret and totalParams from the reference documentation of this
    signing scheme, expected hex computed independently (and also written out literally)."""
    secret = "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP1e3UZjInClVN65XAbvqqM6A7H5fATj0j"
    text = (
        "symbol=LTCBTC&side=BUY&type=LIMIT&timeInForce=GTC&quantity=1&price=0.1&recvWindow=5000&timestamp=1499827319559"
    )
    expected = hmac.new(secret.encode("utf-8"), text.encode("utf-8"), hashlib.sha256).hexdigest()
    assert expected == "c8db56825ae71d6d79447849e617115f4a920fa2acdcab2b053c4b2838bd6b71"
    assert sign(secret, text) == expected


def test_sign_uses_utf8_bytes_of_the_text():
    secret = "k" * 64
    text = "note=café 中&timestamp=1"
    expected = hmac.new(secret.encode(), "note=café 中&timestamp=1".encode(), hashlib.sha256).hexdigest()
    assert sign(secret, text) == expected
    assert sign(secret, text) != sign(secret, "note=cafe 中&timestamp=1")


def test_mixed_vector_has_no_separator():
    """The reference mixed example: query and body concatenated with nothing between them."""
    secret = "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP1e3UZjInClVN65XAbvqqM6A7H5fATj0j"
    query = "symbol=LTCBTC&side=BUY&type=LIMIT&timeInForce=GTC"
    body = "quantity=1&price=0.1&recvWindow=5000&timestamp=1499827319559"
    assert sign(secret, query + body) == "0fd168b8ddb4876a0358a8d14d0c9f3da0e9b20c5d52b2a00fcf7d1c602f9a77"


# --- vectors through the gateway ------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_params_only_in_query(key_and_secret):
    key, secret = key_and_secret
    query = f"a=1&b=two&timestamp={now_ms()}"
    response = send("GET", ECHO, with_signature(query, hmac_hex(secret, query)), key=key)
    assert echo_params(response) == {"a": "1", "b": "two"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_params_only_in_form_body(key_and_secret):
    key, secret = key_and_secret
    body = f"a=1&b=two&timestamp={now_ms()}"
    response = send("POST", ECHO, body=with_signature(body, hmac_hex(secret, body)), key=key)
    assert echo_params(response) == {"a": "1", "b": "two"}
    assert response.json()["method"] == "POST"


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_params_in_form_body_signature_in_query(key_and_secret):
    key, secret = key_and_secret
    body = f"a=1&timestamp={now_ms()}"
    response = send("POST", ECHO, f"signature={hmac_hex(secret, body)}", body=body, key=key)
    assert echo_params(response) == {"a": "1"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_mixed_query_and_body_concatenated_without_separator(key_and_secret):
    key, secret = key_and_secret
    query = "a=1&b=2"
    body = f"note=hello&timestamp={now_ms()}"
    good = hmac_hex(secret, query + body)
    response = send("POST", ECHO, with_signature(query, good), body=body, key=key)
    assert echo_params(response) == {"a": "1", "b": "2", "note": "hello"}
    # signing with an '&' between the two parts is not the rule
    with_ampersand = hmac_hex(secret, query + "&" + body)
    assert_error(send("POST", ECHO, with_signature(query, with_ampersand), body=body, key=key), -1022, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_percent_encoded_email_signed_decoded(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    sent = f"email=a%40b.com&timestamp={ts}"
    signed_text = f"email=a@b.com&timestamp={ts}"
    response = send("GET", ECHO, with_signature(sent, hmac_hex(secret, signed_text)), key=key)
    assert echo_params(response) == {"email": "a@b.com"}
    # and the text exactly as sent verifies too
    response = send("GET", ECHO, with_signature(sent, hmac_hex(secret, sent)), key=key)
    assert echo_params(response) == {"email": "a@b.com"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_percent_encoded_email_in_body_signed_decoded(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    body = f"email=a%40b.com&note=x+y&timestamp={ts}"
    signed_text = f"email=a@b.com&note=x y&timestamp={ts}"
    response = send("POST", ECHO, f"signature={hmac_hex(secret, signed_text)}", body=body, key=key)
    assert echo_params(response) == {"email": "a@b.com", "note": "x y"}


@pytest.mark.django_db
def test_signature_in_header(key_and_secret):
    key, secret = key_and_secret
    query = f"recvWindow=5000&timestamp={now_ms()}"
    response = send("GET", API_KEYS, query, key=key, headers={"X-SERVICE-SIGNATURE": hmac_hex(secret, query)})
    assert response.status_code == 200, response.content
    wrong = hmac_hex(secret, query + "0")
    assert_error(send("GET", API_KEYS, query, key=key, headers={"X-SERVICE-SIGNATURE": wrong}), -1022, 401)


@pytest.mark.django_db
def test_timestamp_in_header_is_signed_as_if_it_ended_the_query(key_and_secret):
    key, secret = key_and_secret
    query = "recvWindow=5000"
    ts = str(now_ms())
    headers = {"X-SERVICE-TIMESTAMP": ts}
    signed = hmac_hex(secret, f"{query}&timestamp={ts}")
    response = send("GET", API_KEYS, with_signature(query, signed), key=key, headers=headers)
    assert response.status_code == 200, response.content
    # the header timestamp is checked like any other
    old_ts = str(now_ms() - 60_000)
    old_signed = hmac_hex(secret, f"{query}&timestamp={old_ts}")
    response = send(
        "GET", API_KEYS, with_signature(query, old_signed), key=key, headers={"X-SERVICE-TIMESTAMP": old_ts}
    )
    assert_error(response, -1021, 400)


@pytest.mark.django_db
def test_unsigned_header_timestamp_cannot_refresh_a_captured_request(key_and_secret):
    """Were the header outside the signature, one captured request could be replayed forever."""
    key, secret = key_and_secret
    query = "recvWindow=5000"
    captured = hmac_hex(secret, query)
    response = send(
        "GET", API_KEYS, with_signature(query, captured), key=key, headers={"X-SERVICE-TIMESTAMP": str(now_ms())}
    )
    assert_error(response, -1022, 401)


@pytest.mark.django_db
def test_timestamp_and_signature_both_in_headers_with_empty_query(key_and_secret):
    key, secret = key_and_secret
    ts = str(now_ms())
    headers = {"X-SERVICE-TIMESTAMP": ts, "X-SERVICE-SIGNATURE": hmac_hex(secret, f"timestamp={ts}")}
    response = send("GET", API_KEYS, key=key, headers=headers)
    assert response.status_code == 200, response.content
    headers["X-SERVICE-SIGNATURE"] = hmac_hex(secret, "")
    assert_error(send("GET", API_KEYS, key=key, headers=headers), -1022, 401)


@pytest.mark.django_db
def test_upper_case_hex_signature_accepted(signed_client, key_and_secret):
    _, secret = key_and_secret
    ts = now_ms()
    upper = hmac_hex(secret, f"timestamp={ts}").upper()
    assert upper != upper.lower()
    response = signed_client.get(API_KEYS, timestamp=ts, signature=upper)
    assert response.status_code == 200, response.content


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_signature_in_the_middle_of_the_query(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    signature = hmac_hex(secret, f"a=1&timestamp={ts}&b=2")
    response = send("GET", ECHO, f"a=1&signature={signature}&timestamp={ts}&b=2", key=key)
    assert echo_params(response) == {"a": "1", "b": "2"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_signature_first_in_the_query(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    signature = hmac_hex(secret, f"a=1&timestamp={ts}")
    response = send("GET", ECHO, f"signature={signature}&a=1&timestamp={ts}", key=key)
    assert echo_params(response) == {"a": "1"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_tampered_value_is_1022(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    signature = hmac_hex(secret, f"amount=10&timestamp={ts}")
    assert_error(send("POST", ECHO, f"amount=11&timestamp={ts}&signature={signature}", key=key), -1022, 401)
    # adding a parameter is tampering too
    response = send("POST", ECHO, f"amount=10&timestamp={ts}&a=1&signature={signature}", key=key)
    assert_error(response, -1022, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_raw_utf8_in_query_signed_over_its_bytes(key_and_secret):
    """A client (curl, a shell script) that puts raw UTF-8 in the query string and signs those bytes:
    the server must sign the same bytes and read the same value as it does for the body."""
    key, secret = key_and_secret
    query = f"note=café&timestamp={now_ms()}"
    response = send("GET", ECHO, with_signature(query, hmac_hex(secret, query)), key=key)
    assert echo_params(response) == {"note": "café"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_raw_utf8_in_body_signed_over_its_bytes(key_and_secret):
    key, secret = key_and_secret
    body = f"note=café&timestamp={now_ms()}"
    response = send("POST", ECHO, f"signature={hmac_hex(secret, body)}", body=body, key=key)
    assert echo_params(response) == {"note": "café"}


# --- parameter smuggling --------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_smuggled_ampersand_in_query_refused(key_and_secret):
    """Signed over the decoded text `a=1&b=2` but sent as `a=1%26b%3D2`: a different split, refused."""
    key, secret = key_and_secret
    ts = now_ms()
    signature = hmac_hex(secret, f"a=1&b=2&timestamp={ts}")
    response = send("GET", ECHO, f"a=1%26b%3D2&timestamp={ts}&signature={signature}", key=key)
    assert_error(response, -1022, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_smuggled_ampersand_in_body_refused(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    signature = hmac_hex(secret, f"a=1&b=2&timestamp={ts}")
    response = send("POST", ECHO, f"signature={signature}", body=f"a=1%26b%3D2&timestamp={ts}", key=key)
    assert_error(response, -1022, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_smuggled_equals_in_key_refused(key_and_secret):
    """`a%3D1=2` is the key `a=1` with value 2; its decoded text `a=1=2` reads as a=`1=2`."""
    key, secret = key_and_secret
    ts = now_ms()
    signature = hmac_hex(secret, f"a=1=2&timestamp={ts}")
    assert_error(send("GET", ECHO, f"a%3D1=2&timestamp={ts}&signature={signature}", key=key), -1022, 401)
    # the honest encoding of a = "1=2" with the same decoded text passes
    response = send("GET", ECHO, f"a=1%3D2&timestamp={ts}&signature={signature}", key=key)
    assert echo_params(response) == {"a": "1=2"}


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_honest_encodings_pass(key_and_secret):
    key, secret = key_and_secret
    ts = now_ms()
    # the value "1&b=2" for a, signed over exactly what is sent
    smuggle_text = f"a=1%26b%3D2&timestamp={ts}"
    response = send("GET", ECHO, with_signature(smuggle_text, hmac_hex(secret, smuggle_text)), key=key)
    assert echo_params(response) == {"a": "1&b=2"}
    # two parameters a and b, signed over what is sent
    plain_text = f"a=1&b=2&timestamp={ts}"
    response = send("GET", ECHO, with_signature(plain_text, hmac_hex(secret, plain_text)), key=key)
    assert echo_params(response) == {"a": "1", "b": "2"}


# --- property test ----------------------------------------------------------------------------------

RESERVED = {"timestamp", "signature", "recvWindow"}
KEYS = st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=8).filter(
    lambda k: k not in RESERVED
)
VALUE_CHARS = st.one_of(
    st.sampled_from([*"@+ &=%", "é", "中", "😀", "ß"]),
    st.characters(codec="utf-8", exclude_categories=("Cs",)),
)
VALUES = st.text(alphabet=VALUE_CHARS, min_size=1, max_size=12)
HEX = "0123456789abcdef"
REPLACEMENTS = string.ascii_letters + string.digits


def assert_invalid_signature(response) -> None:
    assert response.status_code == 401, (response.status_code, response.content)
    assert_error(response, -1022, 401)


def _flip_hex(signature: str, index: int, delta: int) -> str:
    flipped = HEX[(HEX.index(signature[index]) + delta) % 16]
    return signature[:index] + flipped + signature[index + 1 :]


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(KEYS, VALUES, max_size=6), data=st.data())
def test_signature_property(signed_client, params, data):
    ratelimit.counters().reset()  # many requests per test: keep clear of the per-minute limits
    if params and data.draw(st.booleans(), label="put an '&' in a value"):
        # about half the examples: a value that a decoded text would split in two
        name = data.draw(st.sampled_from(sorted(params)), label="param with '&'")
        cut = data.draw(st.integers(0, len(params[name])), label="'&' position")
        params = {**params, name: params[name][:cut] + "&" + params[name][cut:]}
    secret = signed_client.secret
    pairs = [*params.items(), ("timestamp", str(now_ms()))]
    query = urlencode(pairs)
    signature = hmac_hex(secret, query)

    def get(text, sig):
        return signed_client.client.get(
            f"{API_KEYS}?{with_signature(text, sig)}", headers={"X-SERVICE-APIKEY": signed_client.api_key}
        )

    # the correct signature over the urlencoded text verifies
    response = get(query, signature)
    assert response.status_code == 200, (query, response.content)

    # flipping any one hex digit of the signature (to another hex value) is refused
    index = data.draw(st.integers(0, 63), label="signature index")
    delta = data.draw(st.integers(1, 15), label="hex delta")
    assert_invalid_signature(get(query, _flip_hex(signature, index, delta)))
    assert_invalid_signature(get(query, _flip_hex(signature, index, delta).upper()))

    # the percent-decoded text verifies exactly when it splits into the same parameters
    decoded_sig = hmac_hex(secret, unquote_plus(query))
    if any("&" in value for value in params.values()):
        assert_invalid_signature(get(query, decoded_sig))
    else:
        assert get(query, decoded_sig).status_code == 200, query

    if not params:
        return
    # changing one character of a parameter value (as the server reads it) is refused
    name = data.draw(st.sampled_from(sorted(params)), label="param")
    value = params[name]
    position = data.draw(st.integers(0, len(value) - 1), label="value position")
    replacement = data.draw(VALUE_CHARS.filter(lambda c: c != value[position]), label="replacement")
    tampered = {**params, name: value[:position] + replacement + value[position + 1 :]}
    tampered_query = urlencode([*tampered.items(), pairs[-1]])
    assert dict(parse_qsl(tampered_query))[name] != value
    assert_invalid_signature(get(tampered_query, signature))

    # changing one character of the raw, encoded value text is refused
    segments = [urlencode([pair]) for pair in pairs]  # query == "&".join(segments)
    index = list(params).index(name)
    start = sum(len(segment) + 1 for segment in segments[:index]) + len(quote_plus(name)) + 1
    encoded_value = segments[index][len(quote_plus(name)) + 1 :]
    assert query[start : start + len(encoded_value)] == encoded_value
    raw_position = start + data.draw(st.integers(0, len(encoded_value) - 1), label="raw position")
    raw_replacement = data.draw(st.sampled_from(REPLACEMENTS).filter(lambda c: c != query[raw_position]))
    raw_tampered = query[:raw_position] + raw_replacement + query[raw_position + 1 :]
    assert_invalid_signature(get(raw_tampered, signature))


# --- parameters win over headers -------------------------------------------------------------------


@pytest.mark.django_db
def test_query_timestamp_wins_over_header_timestamp(key_and_secret):
    key, secret = key_and_secret
    query = f"timestamp={now_ms() - 60_000}"
    headers = {"X-SERVICE-TIMESTAMP": str(now_ms())}
    response = send("GET", API_KEYS, with_signature(query, hmac_hex(secret, query)), key=key, headers=headers)
    assert_error(response, -1021, 400)


@pytest.mark.django_db
def test_query_signature_wins_over_header_signature(key_and_secret):
    key, secret = key_and_secret
    query = f"timestamp={now_ms()}"
    good, bad = hmac_hex(secret, query), "0" * 64
    response = send("GET", API_KEYS, with_signature(query, good), key=key, headers={"X-SERVICE-SIGNATURE": bad})
    assert response.status_code == 200, response.content
    response = send("GET", API_KEYS, with_signature(query, bad), key=key, headers={"X-SERVICE-SIGNATURE": good})
    assert_error(response, -1022, 401)


@pytest.mark.django_db
@pytest.mark.urls(TEST_URLS)
def test_text_cannot_be_moved_across_the_query_body_boundary(key_and_secret):
    """A captured body `amount=10&timestamp=T` resent as query `amount=1` + body `0&timestamp=T`
    has the same totalParams but another amount: refused."""
    key, secret = key_and_secret
    body = f"amount=10&timestamp={now_ms()}"
    signature = hmac_hex(secret, body)
    honest = send("POST", ECHO, f"signature={signature}", body, key=key)
    assert echo_params(honest)["amount"] == "10"
    for query, rest in (("amount=1", body[len("amount=1") :]), ("amo", body[3:]), ("amount", body[6:])):
        assert query + rest == body
        shifted = send("POST", ECHO, f"{query}&signature={signature}", rest, key=key)
        assert_error(shifted, -1022, 401)
