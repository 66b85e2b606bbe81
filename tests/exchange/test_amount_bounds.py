"""Every amount parameter is bounded by what the amount columns hold (NUMERIC(36, 18); issue 25,
finding 6): an amount with more than 18 integer digits or more than 18 decimal places is refused
by the gateway (-1025) before anything is read or written. Before, PostgreSQL answered 500
(`sub-to-master amount=100000000000000000000`, `universal-transfer amount=1000000000000000000`)
and SQLite stored a failed transfer row. Run on PostgreSQL and on SQLite (Makefile EMBEDDED_TESTS).

The endpoints are found from the URL configuration (every DECIMAL parameter of every method), so an
endpoint added later is covered without being named here."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.apps import apps

from exchange.api.params import ParamSpec
from exchange.api.views import GatewayApi
from exchange.api_urls import urlpatterns
from exchange.runtime.amounts import MAX_AMOUNT
from tests.support.assertions import assert_error, assert_ledger_balanced
from tests.support.factories import AssetFactory, customer
from wallet.withdrawals import fits_precision

AMOUNT_ENDPOINTS = {  # what the discovery must find at least (it fails if one goes missing)
    ("POST", "/openapi/v1/sub-account/transfer/universal-transfer", "amount"),
    ("POST", "/openapi/v1/sub-account/transfer/sub-to-master", "amount"),
    ("POST", "/openapi/transfer/v4/transfers", "amount"),
    ("POST", "/openapi/transfer/v3/transfers", "amount"),
    ("POST", "/openapi/wallet/v1/withdraw/apply", "amount"),
    ("POST", "/openapi/convert/v1/get-quote", "sourceAmount"),
    ("POST", "/openapi/convert/v1/get-quote", "targetAmount"),
}
SUB_ACCOUNT_ONLY = {"/openapi/v1/sub-account/transfer/sub-to-master"}


def _amount_parameters() -> list[tuple[str, str, str]]:
    found = []
    for pattern in urlpatterns:
        view = getattr(pattern.callback, "view_class", None)
        route = str(pattern.pattern)
        if view is None or not issubclass(view, GatewayApi) or "<" in route or route.startswith("^"):
            continue
        for method in (m.upper() for m in view.http_method_names if m != "head" and hasattr(view, m)):
            spec = view.params_spec.get(method, ParamSpec()) if isinstance(view.params_spec, dict) else view.params_spec
            found.extend((method, f"/openapi/{route}", p.name) for p in spec.params if p.kind == "DECIMAL")
    return sorted(set(found))


ENDPOINTS = _amount_parameters()
# 10^18 and 10^20 (the finding's two amounts), 19 decimal places, and far beyond both.
TOO_LARGE = ["1000000000000000000", "100000000000000000000", "999999999999999999999999999999"]
TOO_PRECISE = ["0.0000000000000000001", "1.0000000000000000000000000001"]


def _written() -> dict[str, int]:
    """Rows of every table of the project's apps (a refused request writes none)."""
    return {
        model._meta.label: model.objects.count()
        for app in ("accounts", "wallet", "subaccounts", "convert")
        for model in apps.get_app_config(app).get_models()
    }


@pytest.fixture
def family(db):
    for code in ("BTC", "PHP"):
        AssetFactory(code=code)
    master = customer(funding={"BTC": "1", "PHP": "1000"})
    sub = customer(master=master.user, is_virtual=True, funding={"BTC": "1"})
    peer = customer()
    return master, sub, peer


@pytest.fixture(autouse=True)
def _roomy_rate_limits(settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000


def test_every_amount_endpoint_is_found():
    assert set(ENDPOINTS) >= AMOUNT_ENDPOINTS


def _params(path: str, name: str, amount: str, family) -> dict:
    _, sub, peer = family
    base = {
        "/openapi/v1/sub-account/transfer/universal-transfer": {"asset": "BTC", "toEmail": sub.user.email},
        "/openapi/v1/sub-account/transfer/sub-to-master": {"asset": "BTC"},
        "/openapi/transfer/v4/transfers": {"account": "PHP", "target_address": peer.user.email},
        "/openapi/transfer/v3/transfers": {"account": "PHP", "target_address": peer.user.email},
        "/openapi/wallet/v1/withdraw/apply": {"coin": "BTC", "network": "BTC", "address": "bc1qexample"},
        "/openapi/convert/v1/get-quote": {"sourceCurrency": "BTC", "targetCurrency": "PHP"},
    }.get(path, {})
    return {**base, name: amount}


@pytest.mark.parametrize(("method", "path", "name"), ENDPOINTS)
@pytest.mark.parametrize("amount", TOO_LARGE + TOO_PRECISE)
def test_an_amount_the_columns_cannot_hold_is_refused_before_anything_is_written(family, method, path, name, amount):
    master, sub, _ = family
    caller = sub if path in SUB_ACCOUNT_ONLY else master
    before = _written()
    response = caller.client.request(method, path, _params(path, name, amount, family))
    why = "at most 18 decimal places" if amount in TOO_PRECISE else f"at most {MAX_AMOUNT}"
    assert_error(response, -1025, 400, msg_contains=f"Parameter '{name}' is not valid: {why}")
    assert _written() == before
    assert_ledger_balanced()


@pytest.mark.parametrize(("method", "path", "name"), ENDPOINTS)
def test_the_largest_amount_the_columns_hold_passes_the_gateway(family, method, path, name):
    """The bound is the columns' own: their largest value is not refused by it (the endpoint's own
    rules answer, e.g. the asset's precision or the balance), and no answer is a 500."""
    master, sub, _ = family
    caller = sub if path in SUB_ACCOUNT_ONLY else master
    response = caller.client.request(method, path, _params(path, name, str(MAX_AMOUNT), family))
    assert response.status_code < 500, response.content
    assert "at most 999999999999999999" not in response.content.decode()
    assert Decimal(str(MAX_AMOUNT)) == MAX_AMOUNT
    assert_ledger_balanced()


@pytest.mark.parametrize("places", [0, 2, 8])
def test_a_long_amount_s_last_places_are_counted(places):
    """normalize() rounds to 28 digits: 100000000000000000.00000000000000001 looked like 0 places
    and passed an asset's precision check, then reached the 18-place column whole."""
    long = Decimal("100000000000000000.00000000000000001")
    assert not fits_precision(long, places)
    assert fits_precision(Decimal("100000000000000000.50"), 2)
    assert not fits_precision(Decimal("100000000000000000.50"), 0)
