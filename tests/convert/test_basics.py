"""The convert endpoints end to end through the gateway: pairs, a quote, its accept, the history."""

from decimal import Decimal

from accounts.ledger.check import ledger_check
from tests.support.assertions import assert_balance
from tests.support.factories import customer


def test_pairs_quote_accept_history(convert_world):
    alice = customer(funding={"PHP": "100000"})
    pairs = alice.client.post("/openapi/convert/v1/get-supported-trading-pairs").json()
    assert pairs["status"] == 0
    assert pairs["error"] == "OK"
    assert {"sourceCurrency": "PHP", "targetCurrency": "BTC"}.items() <= {
        k: v
        for p in pairs["data"]
        for k, v in p.items()
        if p["sourceCurrency"] == "PHP" and p["targetCurrency"] == "BTC"
    }.items()
    quote = alice.client.post(
        "/openapi/convert/v1/get-quote", {"sourceCurrency": "PHP", "targetCurrency": "BTC", "sourceAmount": "52000"}
    ).json()
    assert quote["status"] == 0, quote
    data = quote["data"]
    assert data["sourceAmount"] == "52000.00"
    assert data["expiry"] == "10"
    assert Decimal(data["targetAmount"]) < Decimal("0.01")  # spread in the house's favour
    accepted = alice.client.post("/openapi/convert/v1/accept-quote", {"quoteId": data["quoteId"]}).json()
    assert accepted == {
        "status": 0,
        "error": "OK",
        "data": {"orderId": accepted["data"]["orderId"], "status": "SUCCESS"},
    }
    assert_balance(alice.user, "PHP", "48000")
    assert_balance(alice.user, "BTC", data["targetAmount"])
    again = alice.client.post("/openapi/convert/v1/accept-quote", {"quoteId": data["quoteId"]}).json()
    assert again == {"status": 10000003, "error": "quote was already accepted", "data": None}
    history = alice.client.post("/openapi/convert/v1/query-order-history").json()
    assert history["total"] == 1
    assert history["data"][0]["status"] == "SUCCESS"
    assert ledger_check().ok
