"""The official clients' convert calls, as they send them (issue 14, "What must be shown"): the
Python connector's get_supported_trading_pairs, get_quote, accept_quote and query_order_history
(parameters in the query string, empty ones left out, the signature over the decoded text) and the
Postman collection's convert folder (every parameter present, the unused ones empty), each
answered in the convert envelope, the conversion really made."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.convert.helpers import ACCEPT, HISTORY, PAIRS, QUOTE, ok
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.client import connector_call, postman_call
from tests.support.factories import customer


@pytest.fixture
def alice(convert_world):
    return customer(funding={"BTC": "1", "PHP": "100000"})


def _history_has(data: list[dict], order_id: str) -> dict:
    found = [o for o in data if o["orderId"] == order_id]
    assert len(found) == 1, data
    return found[0]


def test_the_connectors_convert_calls(alice):
    client = alice.client
    pairs = ok(connector_call(client, "POST", PAIRS, {"recvWindow": ""}))
    assert {"sourceCurrency": "BTC", "targetCurrency": "PHP"}.items() <= next(
        p for p in pairs if (p["sourceCurrency"], p["targetCurrency"]) == ("BTC", "PHP")
    ).items()
    quote = ok(
        connector_call(
            client, "POST", QUOTE, {"sourceCurrency": "BTC", "targetCurrency": "PHP", "sourceAmount": "0.01"}
        )
    )
    accepted = ok(connector_call(client, "POST", ACCEPT, {"quoteId": quote["quoteId"], "recvWindow": "5000"}))
    assert accepted["status"] == "SUCCESS"
    assert_balance(alice.user, "BTC", Decimal("0.99"))
    assert_balance(alice.user, "PHP", Decimal("100000") + Decimal(quote["targetAmount"]))
    data, total = ok(connector_call(client, "POST", HISTORY, {"startTime": "", "page": "1", "size": "10"}), total=True)
    assert total == 1
    order = _history_has(data, accepted["orderId"])
    assert (order["status"], Decimal(order["sourceAmount"])) == ("SUCCESS", Decimal("0.01"))
    assert_ledger_balanced()


def test_the_postman_collections_convert_folder(alice):
    client = alice.client
    ok(postman_call(client, "POST", PAIRS, {}))
    quote = ok(
        postman_call(
            client,
            "POST",
            QUOTE,
            {"sourceCurrency": "PHP", "targetCurrency": "BTC", "sourceAmount": "1000", "targetAmount": ""},
        )
    )
    accepted = ok(postman_call(client, "POST", ACCEPT, {"quoteId": quote["quoteId"]}))
    assert accepted["status"] == "SUCCESS"
    assert_balance(alice.user, "PHP", Decimal("99000"))
    data, total = ok(
        postman_call(client, "POST", HISTORY, {"startTime": "", "endTime": "", "status": "", "page": "", "size": ""}),
        total=True,
    )
    assert total == 1
    assert _history_has(data, accepted["orderId"])["targetCurrency"] == "BTC"
    assert_ledger_balanced()
