"""Every list endpoint is bounded in rows (issue 18, item 4; docs/api.md, "Request size" and "Rows
per answer"). Built from the URL configuration, so that a new endpoint that pages without an entry
here, or a new GET endpoint that neither pages nor says why its answer is small, fails:

- a paged endpoint declares a maximum page size, the spec's number (PAGED below), and a request one
  over it is refused (-1025, 400) before any query runs; paging never skips more than
  params.MAX_SKIPPED_ROWS (tests/security/test_bad_input.py);
- an unpaged GET endpoint is listed in UNPAGED with what bounds its answer.
"""

from __future__ import annotations

import pytest
from django.urls import URLPattern

from exchange import api_urls
from exchange.api.params import MAX_SKIPPED_ROWS
from exchange.api.views import GatewayApi
from tests.support.assertions import assert_error
from tests.support.factories import customer

PAGE_SIZE_NAMES = ("limit", "per_page", "pageSize", "size")
OFFSET_NAMES = ("offset", "page", "pageNum")

# (METHOD route) -> (page-size parameter, maximum, parameters the request needs besides it)
PAGED = {
    "GET v1/asset/transaction/history": ("pageSize", 100, {"tokenId": "BTC"}),
    "GET wallet/v1/deposit/history": ("limit", 1000, {}),
    "GET wallet/v1/withdraw/history": ("limit", 1000, {}),
    "GET transfer/v3/transfers": ("per_page", 2000, {}),
    "GET transfer/v3/transfers/<str:transfer_id>": ("per_page", 2000, {}),
    "GET v1/sub-account/list": ("limit", 200, {}),
    "GET v1/sub-account/transfer/universal-transfer-history": ("limit", 500, {}),
    "GET v1/sub-account/transfer/sub-history": ("limit", 500, {}),
    "GET v1/sub-account/wallet/deposit/history": ("limit", 1000, {"email": "x@test.example"}),
    "GET v1/fund-collect/get-fund-record": ("size", 100, {}),
    "POST convert/v1/query-order-history": ("size", 100, {}),
}

# One transfer by id: it takes the list's paging parameters (one spec) but answers one row.
ONE_TRANSFER = "GET transfer/v3/transfers/<str:transfer_id>"
# Called with a sub-account's key (a master's is refused before the paging is checked).
SUB_ACCOUNT_ONLY = {"GET v1/sub-account/transfer/sub-history"}

# GET endpoints without paging, and what bounds their answer.
UNPAGED = {
    "v1/ping": "empty",
    "v1/time": "one value",
    "v1/check-sys-status": "one row per business type (fixed set)",
    "v1/user/ip": "one value",
    "v1/exchangeInfo": "one symbol per convert market (configured by staff)",
    "v1/api-keys": "the caller's own keys, created by staff only (no API creates keys)",
    "v1/account": "one account, one balance per asset (assets are configured by staff)",
    "account/v3/crypto-accounts": "one per asset (configured by staff)",
    "wallet/v1/config/getall": "the coins and networks (configured by staff)",
    "wallet/v1/deposit/address": "one address",
    "wallet/v1/withdraw/address-whitelist": "the caller's whitelist, entered by staff",
    "v1/sub-account/asset": "one sub-account's balances (one per asset)",
    "v1/sub-account/apikey/ip-restriction": "one key's IP list, at most MAX_IP_ADDRESSES (30)",
    "v1/sub-account/wallet/deposit/address": "one address",
    "schema": "the OpenAPI document, built once per process",
    "^.*$": "the 404 envelope",
}


def _endpoints() -> dict[str, tuple[type[GatewayApi], str]]:
    found = {}
    for pattern in api_urls.urlpatterns:
        assert isinstance(pattern, URLPattern), pattern
        view = getattr(pattern.callback, "view_class", None)
        if view is None or not issubclass(view, GatewayApi):
            continue
        for method in view.http_method_names:
            if method not in ("head", "options") and hasattr(view, method):
                found[f"{method.upper()} {pattern.pattern}"] = (view, method.upper())
    return found


def _params(view: type[GatewayApi], method: str) -> dict:
    return {param.name: param for param in view().spec_for(method).params}


def test_every_paged_endpoint_declares_its_documented_maximum():
    paged = {}
    for route, (view, method) in _endpoints().items():
        params = _params(view, method)
        size = [name for name in PAGE_SIZE_NAMES if name in params]
        if size:
            paged[route] = (size[0], params[size[0]].max)
        offsets = [params[name] for name in OFFSET_NAMES if name in params]
        for offset in offsets:  # a page number or offset is bounded too (rows skipped at most 10,000,000)
            assert offset.max is None or offset.max <= MAX_SKIPPED_ROWS, (route, offset)
    assert set(paged) == set(PAGED), "a paged endpoint without an entry in PAGED (or one that went away)"
    for route, (name, maximum) in paged.items():
        assert (name, maximum) == PAGED[route][:2], route
        assert maximum is not None, route


def test_every_unpaged_get_endpoint_says_what_bounds_its_answer():
    unpaged = {route.split(" ", 1)[1] for route in _endpoints() if route.startswith("GET ") and route not in PAGED}
    assert unpaged == set(UNPAGED)


@pytest.fixture
def clients(db, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**9
    master = customer(email="bounds@test.example")
    sub = customer(email="bounds-sub@test.example", master=master.user)
    return {"master": master.client, "sub": sub.client}


def _client_for(clients, route):
    return clients["sub" if route in SUB_ACCOUNT_ONLY else "master"]


@pytest.mark.parametrize("route", sorted(PAGED))
def test_one_row_over_the_maximum_is_refused(clients, route):
    name, maximum, extra = PAGED[route]
    method, path = route.split(" ", 1)
    path = "/openapi/" + path.replace("<str:transfer_id>", "1")
    response = _client_for(clients, route).request(method, path, {**extra, name: str(maximum + 1)})
    assert_error(response, -1025, 400, msg_contains=name)


@pytest.mark.parametrize("route", sorted(set(PAGED) - {ONE_TRANSFER}))
def test_paging_deeper_than_the_skip_bound_is_refused(clients, route):
    name, maximum, extra = PAGED[route]
    method, path = route.split(" ", 1)
    view, _ = _endpoints()[route]
    params = _params(view, method)
    depth = [param for param in OFFSET_NAMES if param in params]
    assert depth, route
    depth_name = depth[0]
    # Declared: offset (10,000,000) or pageNum (1000 x 100 rows); else a page number, checked against
    # MAX_SKIPPED_ROWS with the page size (params.check_skip).
    declared = params[depth_name].max
    value = declared + 1 if declared is not None else MAX_SKIPPED_ROWS // maximum + 2
    path = "/openapi/" + path.replace("<str:transfer_id>", "1")
    response = _client_for(clients, route).request(method, path, {**extra, name: str(maximum), depth_name: str(value)})
    assert_error(response, -1025, 400, msg_contains=depth_name)
