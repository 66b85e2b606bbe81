"""get-quote: exactly one amount, a supported pair, the pair's bounds and precision, rounding in the
house's favour at the precision edges both ways (expected values computed here with Decimal), the
price (target per source, the spread against the customer), the expiry, the 1000 ms refresh
interval, stale prices, the CONVERT business status and the account's right to convert."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from decimal import Decimal, localcontext

import pytest
from django.utils import timezone

from convert import errors, services
from convert.models import AssetPrice, Pair, Quote
from exchange.platform.services import business_status_set
from tests.convert.helpers import (
    BPS,
    LIQUIDITY,
    ONE_AMOUNT,
    SUSPENDED,
    customer_price,
    down,
    ok,
    quote,
    refused,
    set_market,
    up,
)
from tests.support.assertions import assert_error
from tests.support.factories import UserFactory, customer

PRECISION = {"BTC": 8, "ETH": 8, "USDT": 6, "PHP": 2}  # the assets' transfer precision (source places)


def expected_for_source(source: str, target: str, amount: str) -> tuple[Decimal, Decimal, Decimal]:
    """(source, target, fee) of a sourceAmount quote: gross target down to the pair's precision,
    the fee up, the customer gets gross - fee."""
    pair = Pair.objects.get(source__code=source, target__code=target)
    with localcontext(prec=60):
        gross = down(Decimal(amount) * customer_price(source, target), pair.precision)
        fee = up(gross * pair.fee_bps / BPS, pair.precision)
    return Decimal(amount), gross - fee, fee


def expected_for_target(source: str, target: str, amount: str) -> tuple[Decimal, Decimal, Decimal]:
    """(source, target, fee) of a targetAmount quote: the gross target (target + fee) up, the source up."""
    pair = Pair.objects.get(source__code=source, target__code=target)
    with localcontext(prec=60):
        gross = up(Decimal(amount) / (1 - Decimal(pair.fee_bps) / BPS), pair.precision)
        paid = up(gross / customer_price(source, target), PRECISION[source])
    return paid, Decimal(amount), gross - Decimal(amount)


def _amounts(data: dict) -> tuple[Decimal, Decimal]:
    return Decimal(data["sourceAmount"]), Decimal(data["targetAmount"])


@pytest.fixture
def alice(convert_world):
    return customer(funding={"BTC": "1", "PHP": "100000"})


@pytest.fixture
def flat_btc_php(convert_world):
    """BTC/PHP at 5,200,000 without spread: the edges below are exact numbers."""
    set_market("BTC", "PHP", "5200000", spread_bps=0)


# --- exactly one amount ---------------------------------------------------------------------------


@pytest.mark.parametrize("amounts", [{}, {"source_amount": "0.001", "target_amount": "5000"}], ids=["neither", "both"])
def test_exactly_one_amount(alice, amounts):
    refused(quote(alice.client, "BTC", "PHP", **amounts), ONE_AMOUNT)
    assert not Quote.objects.exists()


def test_malformed_parameters_get_the_gateway_envelope(alice):
    body = assert_error(alice.client.post("/openapi/convert/v1/get-quote", {"targetCurrency": "PHP"}), -1105, 400)
    assert "sourceCurrency" in body["msg"]
    for amount in ("abc", "-1", "1e-3", "0x10"):
        assert_error(quote(alice.client, "BTC", "PHP", source_amount=amount), -1025, 400)
    assert not Quote.objects.exists()


# --- pairs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), [("PHP", "ETH"), ("XYZ", "PHP"), ("BTC", "BTC")])
def test_an_unknown_pair_is_not_supported(alice, source, target):
    refused(quote(alice.client, source, target, source_amount="1"), f"the pair {source} to {target} is not supported")
    assert not Quote.objects.exists()


def test_a_disabled_pair_is_not_supported(alice):
    Pair.objects.filter(source__code="BTC", target__code="PHP").update(enabled=False)
    refused(quote(alice.client, "BTC", "PHP", source_amount="0.001"), "the pair BTC to PHP is not supported")
    ok(quote(alice.client, "PHP", "BTC", source_amount="100"))  # the other direction is its own pair


# --- bounds and precision -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("0.00009999", "sourceAmount is below the minimum 0.0001"),
        ("5.00000001", "sourceAmount is above the maximum 5"),
        ("6", "sourceAmount is above the maximum 5"),
        ("0", "sourceAmount must be positive"),
    ],
)
def test_source_amount_outside_the_pairs_bounds(alice, amount, message):
    refused(quote(alice.client, "BTC", "PHP", source_amount=amount), message)
    assert not Quote.objects.exists()


@pytest.mark.parametrize("amount", ["0.0001", "5", "5.00000000"])
def test_source_amount_at_the_bounds_is_quoted(alice, amount):
    data = ok(quote(alice.client, "BTC", "PHP", source_amount=amount))
    assert Decimal(data["sourceAmount"]) == Decimal(amount)


def test_target_amount_whose_source_is_outside_the_bounds(alice):
    refused(quote(alice.client, "BTC", "PHP", target_amount="0.01"), "sourceAmount is below the minimum 0.0001")
    refused(quote(alice.client, "BTC", "PHP", target_amount="99999999"), "sourceAmount is above the maximum 5")
    refused(quote(alice.client, "BTC", "PHP", target_amount="0"), "targetAmount must be positive")
    assert not Quote.objects.exists()


@pytest.mark.parametrize(
    ("source", "target", "amount", "message"),
    [
        ("BTC", "PHP", "0.000100001", "sourceAmount has more than 8 decimal places"),
        ("PHP", "BTC", "100.001", "sourceAmount has more than 2 decimal places"),
        ("PHP", "USDT", "100.5001", "sourceAmount has more than 2 decimal places"),
        ("USDT", "PHP", "10.0000001", "sourceAmount has more than 6 decimal places"),
    ],
)
def test_source_amount_with_more_places_than_the_source_asset(alice, source, target, amount, message):
    """The source's places are the asset's transfer precision (BTC 8, USDT 6, PHP 2)."""
    refused(quote(alice.client, source, target, source_amount=amount), message)
    assert not Quote.objects.exists()


@pytest.mark.parametrize(
    ("source", "target", "amount", "message"),
    [
        ("BTC", "PHP", "1000.001", "targetAmount has more than 2 decimal places"),
        ("PHP", "BTC", "0.000000001", "targetAmount has more than 8 decimal places"),
        ("ETH", "USDT", "100.0000001", "targetAmount has more than 6 decimal places"),
    ],
)
def test_target_amount_with_more_places_than_the_pairs_precision(alice, source, target, amount, message):
    refused(quote(alice.client, source, target, target_amount=amount), message)
    assert not Quote.objects.exists()


def test_the_pairs_precision_not_the_assets_governs_the_target(alice):
    """PHP -> USDT has precision 6 (USDT's transfer precision is 6 too); narrowing the pair to 2
    refuses a third place even though the asset would allow it."""
    Pair.objects.filter(source__code="PHP", target__code="USDT").update(precision=2)
    refused(quote(alice.client, "PHP", "USDT", target_amount="10.001"), "targetAmount has more than 2 decimal places")
    data = ok(quote(alice.client, "PHP", "USDT", target_amount="10.01"))
    assert data["targetAmount"] == "10.01"
    data = ok(quote(alice.client, "PHP", "USDT", source_amount="1000"))
    assert re.fullmatch(r"\d+\.\d{2}", data["targetAmount"])


def test_trailing_zeros_are_not_extra_places(alice):
    data = ok(quote(alice.client, "PHP", "BTC", source_amount="100.0000"))
    assert data["sourceAmount"] == "100.00"


def test_a_target_that_rounds_to_nothing_is_refused(alice):
    Pair.objects.filter(source__code="PHP", target__code="BTC").update(min_source_amount=Decimal("0.01"))
    refused(quote(alice.client, "PHP", "BTC", source_amount="0.01"), "the amount is too small to convert")
    assert not Quote.objects.exists()


# --- rounding at the precision edges ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "target"),
    [
        ("0.00012345", "641.94"),  # exactly representable: no rounding
        ("0.00012346", "641.99"),  # 641.992 rounds down, not to nearest
        ("0.00019999", "1039.94"),  # 1039.948 rounds down, not half up
        ("0.00010001", "520.05"),  # 520.052
        ("4.99999999", "25999999.94"),  # 25999999.948
    ],
)
def test_source_amount_quote_rounds_the_target_down(alice, flat_btc_php, amount, target):
    data = ok(quote(alice.client, "BTC", "PHP", source_amount=amount))
    assert (data["sourceAmount"], data["targetAmount"], data["price"]) == (
        f"{Decimal(amount):.8f}",
        target,
        "5200000",
    )
    assert _amounts(data) == expected_for_source("BTC", "PHP", amount)[:2]


@pytest.mark.parametrize(
    ("target", "source"),
    [
        ("641.94", "0.00012345"),  # exact
        ("641.95", "0.00012346"),  # 0.000123451923... rounds up
        ("641.99", "0.00012346"),  # 0.000123459615... rounds up
        ("520.00", "0.00010000"),  # exact
        ("520.01", "0.00010001"),  # 0.0001000019... rounds up
    ],
)
def test_target_amount_quote_rounds_the_source_up(alice, flat_btc_php, target, source):
    data = ok(quote(alice.client, "BTC", "PHP", target_amount=target))
    assert (data["sourceAmount"], data["targetAmount"]) == (source, target)
    assert _amounts(data) == expected_for_target("BTC", "PHP", target)[:2]


def test_the_inverse_direction_rounds_in_the_house_favour_too(alice, flat_btc_php):
    """PHP -> BTC is priced at 1 / 5,200,000 truncated to 18 places (0.000000192307692307): 52,000
    PHP buys 0.00999999 BTC, not 0.01; and 0.01 BTC costs 52,000.01 PHP."""
    assert customer_price("PHP", "BTC") == Decimal("0.000000192307692307")
    data = ok(quote(alice.client, "PHP", "BTC", source_amount="52000"))
    assert (data["sourceAmount"], data["targetAmount"], data["price"]) == (
        "52000.00",
        "0.00999999",
        "0.000000192307692307",
    )
    data = ok(quote(alice.client, "PHP", "BTC", target_amount="0.01"))
    assert (data["sourceAmount"], data["targetAmount"]) == ("52000.01", "0.01000000")
    data = ok(quote(alice.client, "PHP", "BTC", source_amount="5200.01"))
    assert data["targetAmount"] == "0.00100000"  # 0.0010000019...


@pytest.mark.parametrize(
    ("source", "target", "amount"),
    [
        ("BTC", "PHP", "0.01"),
        ("BTC", "PHP", "0.12345678"),
        ("PHP", "BTC", "52000"),
        ("PHP", "BTC", "777.77"),
        ("USDT", "PHP", "123.456789"),
        ("PHP", "USDT", "9999.99"),
        ("ETH", "USDT", "1.23456789"),
        ("USDT", "ETH", "3100"),
        ("BTC", "USDT", "0.00033333"),
        ("USDT", "BTC", "89.5"),
    ],
)
def test_demo_prices_with_spread_both_ways(alice, source, target, amount):
    """With the demo spreads: sourceAmount and targetAmount quotes match the values computed here,
    and a target quote asks at least as much source as a source quote would for the same target."""
    data = ok(quote(alice.client, source, target, source_amount=amount))
    assert Decimal(data["price"]) == customer_price(source, target)
    assert len(Decimal(data["price"]).normalize().as_tuple().digits) <= 12  # 12 significant digits at most
    assert _amounts(data) == expected_for_source(source, target, amount)[:2]
    got = data["targetAmount"]
    back = ok(quote(alice.client, source, target, target_amount=got))
    assert _amounts(back) == expected_for_target(source, target, got)[:2]
    assert Decimal(back["sourceAmount"]) <= Decimal(amount)  # rounding up never asks more than was quoted
    with localcontext(prec=60):
        assert Decimal(back["sourceAmount"]) * Decimal(back["price"]) >= Decimal(got)


def test_the_fee_is_rounded_up_and_taken_from_the_target(alice, flat_btc_php):
    Pair.objects.filter(source__code="BTC", target__code="PHP").update(fee_bps=25)
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.00012346"))  # gross 641.99, fee 1.604975
    assert data["targetAmount"] == "640.38"
    assert Quote.objects.get(quote_id=data["quoteId"]).fee == Decimal("1.61")
    assert expected_for_source("BTC", "PHP", "0.00012346") == (
        Decimal("0.00012346"),
        Decimal("640.38"),
        Decimal("1.61"),
    )
    data = ok(quote(alice.client, "BTC", "PHP", target_amount="640.38"))  # gross 641.98496... up to 641.99
    assert (data["sourceAmount"], data["targetAmount"]) == ("0.00012346", "640.38")
    assert Quote.objects.get(quote_id=data["quoteId"]).fee == Decimal("1.61")
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.001"))
    assert data["targetAmount"] == "5187.00"  # 5200 less 13.00
    assert Quote.objects.get(quote_id=data["quoteId"]).fee == Decimal("13.00")


# --- price, expiry, storage --------------------------------------------------------------------------


def test_price_is_target_per_source_with_the_spread_against_the_customer(alice):
    """BTC/PHP at 5,200,000 with the demo's 20 bp spread: BTC -> PHP at 5,189,600; PHP -> BTC at
    (1 / 5,200,000) less 20 bp. Both are worse for the customer than the market, each way."""
    to_php = ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    assert to_php["price"] == "5189600"
    assert to_php["targetAmount"] == "51896.00"
    to_btc = ok(quote(alice.client, "PHP", "BTC", source_amount="51896"))
    with localcontext(prec=60):
        inverse = Decimal(1) / Decimal(5200000)
        assert Decimal(to_btc["price"]) == down(inverse * Decimal("0.998"), 18)
        assert Decimal(to_btc["price"]) < inverse
        assert Decimal(to_btc["targetAmount"]) < Decimal("0.01")  # a round trip loses both spreads


def test_the_quote_is_stored_and_valid_for_the_ttl(alice, settings):
    before = timezone.now()
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    assert set(data) == {
        "quoteId",
        "sourceCurrency",
        "targetCurrency",
        "sourceAmount",
        "targetAmount",
        "price",
        "expiry",
    }
    assert all(isinstance(value, str) for value in data.values())
    assert data["expiry"] == "10"
    assert re.fullmatch(r"[0-9a-f]{32}", data["quoteId"])
    stored = Quote.objects.get(quote_id=data["quoteId"])
    assert stored.user_id == alice.user.pk
    assert (stored.pair.source.code, stored.pair.target.code) == ("BTC", "PHP")
    assert (stored.source_amount, stored.target_amount, stored.fee) == (Decimal("0.01"), Decimal("51896"), 0)
    assert stored.price == Decimal("5189600")
    assert stored.market_price == Decimal("5200000")
    assert stored.expires_at - stored.created_at == timedelta(seconds=10)
    assert before <= stored.created_at <= timezone.now()
    settings.QUOTE_TTL_SECONDS = 30
    data = ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    assert data["expiry"] == "30"
    assert Quote.objects.filter(user=alice.user).count() == 2


def test_expiry_counts_down_in_whole_seconds():
    quote_row = Quote(expires_at=timezone.now() + timedelta(seconds=3.2))
    assert services.seconds_left(quote_row) == 4
    quote_row.expires_at = timezone.now() - timedelta(seconds=1)
    assert services.seconds_left(quote_row) == 0


# --- the refresh interval --------------------------------------------------------------------------


def test_one_quote_per_pair_per_second(alice, settings):
    settings.CONVERT_QUOTE_INTERVAL_MS = 1000
    bob = customer(funding={"BTC": "1"})
    first = time.monotonic()
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))
    answered = time.monotonic()  # the server started the pair's interval between `first` and now
    too_soon = "quote requests are limited to one per 1000 ms per pair; try again later"
    refused(quote(alice.client, "BTC", "PHP", source_amount="0.02"), too_soon)
    refused(quote(alice.client, "BTC", "PHP", target_amount="1000"), too_soon)  # either amount
    ok(quote(alice.client, "PHP", "BTC", source_amount="100"))  # another pair
    ok(quote(alice.client, "BTC", "USDT", source_amount="0.01"))
    ok(quote(bob.client, "BTC", "PHP", source_amount="0.01"))  # another account
    assert time.monotonic() - first < 1, "too slow to test the interval"
    assert Quote.objects.filter(user=alice.user).count() == 3
    time.sleep(max(0.0, 1.05 - (time.monotonic() - answered)))  # a loaded machine's slow first answer included
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.02"))
    assert Quote.objects.filter(user=alice.user).count() == 4


def test_a_refused_quote_does_not_count_against_the_interval(alice, settings):
    settings.CONVERT_QUOTE_INTERVAL_MS = 1000
    refused(quote(alice.client, "BTC", "PHP", source_amount="9"), "sourceAmount is above the maximum 5")
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))


# --- stale prices, business status, the account --------------------------------------------------------


def test_a_stale_price_is_not_quoted(alice, settings):
    age = timedelta(seconds=settings.CONVERT_PRICE_MAX_AGE_SECONDS + 1)
    AssetPrice.objects.filter(asset__code="BTC").update(price_updated_at=timezone.now() - age)
    refused(quote(alice.client, "BTC", "PHP", source_amount="0.01"), LIQUIDITY)
    refused(quote(alice.client, "PHP", "BTC", source_amount="100"), LIQUIDITY)  # the same market, either way
    ok(quote(alice.client, "ETH", "USDT", source_amount="0.01"))  # a market without BTC is fresh
    assert Quote.objects.filter(pair__market__base__code="BTC", pair__market__quote__code="PHP").count() == 0
    settings.CONVERT_PRICE_MAX_AGE_SECONDS = 3600
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))


def test_a_price_just_within_the_age_is_quoted(alice, settings):
    young = timedelta(seconds=settings.CONVERT_PRICE_MAX_AGE_SECONDS - 5)
    AssetPrice.objects.filter(asset__code="BTC").update(price_updated_at=timezone.now() - young)
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))


def test_convert_business_off_refuses_quotes(alice):
    business_status_set(business_type="CONVERT", is_on=False)
    refused(quote(alice.client, "BTC", "PHP", source_amount="0.01"), SUSPENDED)
    assert not Quote.objects.exists()
    business_status_set(business_type="SPOT", is_on=False)
    business_status_set(business_type="CONVERT", is_on=True)
    ok(quote(alice.client, "BTC", "PHP", source_amount="0.01"))  # SPOT is another business


def test_an_account_barred_from_moving_money_out_may_not_quote(alice):
    alice.user.can_withdraw = False
    alice.user.save()
    refused(quote(alice.client, "BTC", "PHP", source_amount="0.01"), "unable to fetch account information")
    assert not Quote.objects.exists()


@pytest.mark.parametrize("field", ["is_frozen", "is_active"])
def test_the_service_refuses_a_frozen_or_deactivated_account(convert_world, field):
    """The gateway already refuses such an account's keys (-2015, test_pairs.py); the service's own
    check holds for callers without a key."""
    user = UserFactory(**{field: field == "is_frozen"})
    with pytest.raises(errors.AccountUnavailable) as raised:
        services.quote_create(user=user, source_code="BTC", target_code="PHP", source_amount=Decimal("0.01"))
    assert raised.value.as_envelope() == {
        "status": 10000003,
        "error": "unable to fetch account information",
        "data": None,
    }
    assert not Quote.objects.exists()
