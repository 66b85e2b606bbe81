"""query-order-history: the caller's orders oldest first, every field of the spec's order, the
period (startTime/endTime, numeric ms strings, the end covering its whole millisecond), status only
with startTime (-1025 otherwise), page and size, and total."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext

import pytest

from convert.models import Order
from tests.convert.helpers import EXPIRED, HISTORY, INSUFFICIENT, ok
from tests.support.assertions import assert_error
from tests.support.factories import OrderFactory, customer

T0 = datetime(2026, 1, 1, 0, 0, 0, 500, tzinfo=UTC)  # half a millisecond past a whole one
T0_MS = 1767225600000
FIELDS = {
    "orderId",
    "quoteId",
    "userId",
    "sourceCurrency",
    "targetCurrency",
    "sourceAmount",
    "targetAmount",
    "price",
    "fee",
    "inversePrice",
    "status",
    "createdAt",
    "errorCode",
    "errorMessage",
}


@pytest.fixture
def world(convert_world):
    alice = customer(funding={"BTC": "1", "PHP": "1000000", "USDT": "1000"})
    bob = customer(funding={"BTC": "1"})
    second = timedelta(seconds=1)
    orders = [
        OrderFactory(user=alice.user, source="BTC", target="PHP", source_amount="0.01", created_at=T0, funded=False),
        OrderFactory(
            user=alice.user,
            source="BTC",
            target="USDT",
            source_amount="0.02",
            created_at=T0 + second,
            outcome="expire",
            funded=False,
        ),
        OrderFactory(
            user=alice.user, source="PHP", target="BTC", source_amount="52000", created_at=T0 + 2 * second, funded=False
        ),
        OrderFactory(
            user=alice.user,
            source="PHP",
            target="USDT",
            source_amount="2000000",
            created_at=T0 + 3 * second,
            outcome="insufficient",
            funded=False,
        ),
        OrderFactory(
            user=alice.user, source="USDT", target="PHP", source_amount="100", created_at=T0 + 4 * second, funded=False
        ),
    ]
    OrderFactory(
        user=bob.user, source="BTC", target="PHP", source_amount="0.01", created_at=T0 + second, funded=False
    )  # not alice's: never listed
    return alice, orders


def _ids(data: list[dict]) -> list[str]:
    return [row["orderId"] for row in data]


def _expected(order: Order) -> dict:
    """The spec's order, built here from the row."""
    with localcontext(prec=60):
        inverse = (Decimal(1) / order.price).quantize(Decimal("1e-18"))
    source_places = {"BTC": 8, "ETH": 8, "USDT": 6, "PHP": 2}[order.pair.source.code]
    precision = order.pair.precision
    return {
        "orderId": str(order.pk),
        "quoteId": order.quote.quote_id,
        "userId": str(order.user_id),
        "sourceCurrency": order.pair.source.code,
        "targetCurrency": order.pair.target.code,
        "sourceAmount": f"{order.source_amount:.{source_places}f}",
        "targetAmount": f"{order.target_amount:.{precision}f}",
        "price": f"{order.price.normalize():f}",
        "fee": f"{order.fee:.{precision}f}",
        "inversePrice": f"{inverse.normalize():f}",
        "status": order.status,
        "createdAt": str(int(order.created_at.timestamp() * 1000)),
        "errorCode": order.error_code,
        "errorMessage": order.error_message,
    }


def test_the_whole_history_oldest_first_with_every_field(world):
    alice, orders = world
    data, total = ok(alice.client.post(HISTORY), total=True)
    assert total == 5
    assert _ids(data) == [str(o.pk) for o in orders]
    for row, order in zip(data, orders, strict=True):
        assert set(row) == FIELDS
        assert row == _expected(order)
        assert all(isinstance(value, str) for value in row.values()), row
    first, expired, _, short, _ = data
    assert first["createdAt"] == str(T0_MS)
    assert (first["status"], first["errorCode"], first["errorMessage"]) == ("SUCCESS", "", "")
    assert (first["sourceAmount"], first["fee"]) == ("0.01000000", "0.00")
    assert (expired["status"], expired["errorCode"], expired["errorMessage"]) == ("FAILED", "10000003", EXPIRED)
    assert (short["status"], short["errorCode"], short["errorMessage"]) == ("FAILED", "10000003", INSUFFICIENT)
    with localcontext(prec=60):  # inversePrice is source per target, to 18 places
        assert abs(Decimal(first["inversePrice"]) - 1 / Decimal(first["price"])) <= Decimal("0.5e-18")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"startTime": str(T0_MS + 1000)}, [1, 2, 3, 4]),
        ({"startTime": str(T0_MS + 1001)}, [2, 3, 4]),
        ({"endTime": str(T0_MS + 3000)}, [0, 1, 2, 3]),  # the order at 3000.5 ms is in its ms
        ({"endTime": str(T0_MS + 2999)}, [0, 1, 2]),
        ({"startTime": str(T0_MS + 1000), "endTime": str(T0_MS + 3000)}, [1, 2, 3]),
        ({"startTime": str(T0_MS), "endTime": str(T0_MS)}, [0]),
        ({"startTime": str(T0_MS + 5000)}, []),
        ({"endTime": str(T0_MS - 1)}, []),
    ],
)
def test_the_period(world, params, expected):
    alice, orders = world
    data, total = ok(alice.client.post(HISTORY, params), total=True)
    assert _ids(data) == [str(orders[i].pk) for i in expected]
    assert total == len(expected)


@pytest.mark.parametrize(
    ("status", "start", "expected"),
    [("SUCCESS", T0_MS, [0, 2, 4]), ("FAILED", T0_MS, [1, 3]), ("SUCCESS", T0_MS + 1000, [2, 4]), ("TODO", T0_MS, [])],
)
def test_status_with_a_start_time(world, status, start, expected):
    alice, orders = world
    data, total = ok(alice.client.post(HISTORY, {"status": status, "startTime": str(start)}), total=True)
    assert _ids(data) == [str(orders[i].pk) for i in expected]
    assert total == len(expected)


def test_status_without_a_start_time_is_1025(world):
    alice, _ = world
    body = assert_error(alice.client.post(HISTORY, {"status": "SUCCESS"}), -1025, 400)
    assert "status" in body["msg"]
    body = assert_error(alice.client.post(HISTORY, {"status": "SUCCESS", "endTime": str(T0_MS)}), -1025, 400)
    assert "status" in body["msg"]


def test_pages(world):
    alice, orders = world
    pages = []
    for page in (1, 2, 3, 4):
        data, total = ok(alice.client.post(HISTORY, {"page": page, "size": 2}), total=True)
        assert total == 5
        pages.append(_ids(data))
    assert pages == [[str(o.pk) for o in orders[i : i + 2]] for i in (0, 2, 4)] + [[]]
    data, total = ok(alice.client.post(HISTORY, {"size": 100}), total=True)
    assert (len(data), total) == (5, 5)
    data, total = ok(alice.client.post(HISTORY, {"page": 2, "size": 1, "startTime": str(T0_MS + 1000)}), total=True)
    assert (_ids(data), total) == ([str(orders[2].pk)], 4)


def test_the_default_page_is_ten(convert_world):
    alice = customer(funding={"BTC": "1"})
    made = [
        OrderFactory(
            user=alice.user,
            source="BTC",
            target="PHP",
            source_amount="0.001",
            created_at=T0 + timedelta(seconds=i),
            funded=False,
        )
        for i in range(12)
    ]
    data, total = ok(alice.client.post(HISTORY), total=True)
    assert (_ids(data), total) == ([str(o.pk) for o in made[:10]], 12)


@pytest.mark.parametrize(
    "params",
    [
        {"startTime": "abc"},
        {"startTime": "-1"},
        {"endTime": "1.5"},
        {"startTime": str(T0_MS + 1), "endTime": str(T0_MS)},
        {"status": "DONE", "startTime": str(T0_MS)},
        {"page": "0"},
        {"size": "0"},
        {"size": "101"},
        {"startTime": "99999999999999999999"},
    ],
)
def test_malformed_parameters_are_1025(world, params):
    alice, _ = world
    assert_error(alice.client.post(HISTORY, params), -1025, 400)


def test_an_account_without_orders(convert_world):
    assert ok(customer().client.post(HISTORY), total=True) == ([], 0)
