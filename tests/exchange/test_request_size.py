"""The gateway's own bounds on what a request carries (docs/api.md, "Request size"), the same ones
nginx applies in front (tests/stack/test_limits.py): a body over API_MAX_BODY_BYTES (16 KB) gets 413
and a query string over API_MAX_QUERY_BYTES (8 KB) 414, both `{code: -1010, msg}`, refused from the
announced length before the body is read or the signature checked; just under, the request is
handled as usual. Django's own body bound (DATA_UPLOAD_MAX_MEMORY_SIZE) answers the same envelope.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.test import Client

from exchange.api.errors import RequestTooLarge, _translate
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

TRANSFER = "/openapi/transfer/v4/transfers"
ACCOUNT = "/openapi/v1/account"


def test_the_documented_numbers():
    assert settings.API_MAX_BODY_BYTES == 16 * 1024
    assert settings.API_MAX_QUERY_BYTES == 8 * 1024
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 64 * 1024
    assert settings.DATA_UPLOAD_MAX_NUMBER_FIELDS == 1000


def _padded_body(size: int) -> str:
    """A form body of exactly `size` bytes (an unknown parameter carries the padding)."""
    head = "asset=BTC&amount=1&pad="
    return head + "a" * (size - len(head))


def test_a_body_over_the_bound_gets_413_before_its_signature_is_checked(signed_client):
    body = _padded_body(settings.API_MAX_BODY_BYTES + 1)
    response = signed_client.post(TRANSFER, body=body)  # correctly signed: the size refuses it first
    assert_error(response, -1010, 413, msg_contains="16384 bytes")
    response = signed_client.post(TRANSFER, body=body, signature="0" * 64)
    assert_error(response, -1010, 413)


def test_a_body_at_the_bound_is_read_and_handled(signed_client):
    response = signed_client.post(TRANSFER, body=_padded_body(settings.API_MAX_BODY_BYTES))
    assert response.status_code != 413
    assert response.json().get("code") != -1010, response.json()  # refused for its parameters, not its size


def test_a_query_string_over_the_bound_gets_414(signed_client):
    response = signed_client.get(ACCOUNT, {"pad": "a" * settings.API_MAX_QUERY_BYTES})
    assert_error(response, -1010, 414, msg_contains="8192 bytes")
    # Under it: handled (an unknown parameter is not a size problem).
    response = signed_client.get(ACCOUNT, {"pad": "a" * (settings.API_MAX_QUERY_BYTES - 200)})
    assert response.status_code != 414


def test_an_unauthenticated_oversized_body_and_a_malformed_length_are_refused():
    client = Client()
    response = client.post("/openapi/v1/ping", data="a" * (20 * 1024), content_type="application/x-www-form-urlencoded")
    assert_error(response, -1010, 413)
    response = client.post(
        "/openapi/v1/ping", data="a=1", content_type="application/x-www-form-urlencoded", CONTENT_LENGTH="abc"
    )
    assert_error(response, -1010, 400, msg_contains="Content-Length")


def test_djangos_own_body_bound_is_the_same_envelope():
    error = _translate(RequestDataTooBig("too big"), "POST")
    assert isinstance(error, RequestTooLarge)
    assert (error.code, error.http_status) == (-1010, 413)
