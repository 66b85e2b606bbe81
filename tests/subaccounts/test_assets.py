"""Sub-account assets (issue 15, item 3)."""

from __future__ import annotations

from decimal import Decimal

from accounts import ledger
from accounts.ledger.models import BusinessType
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error


def test_balances_of_a_sub_account(family):
    ledger.post(  # some of sub1's BTC held (as a withdrawal would)
        legs=ledger.hold(family.sub1.user.pk, "BTC", Decimal("0.1")),
        kind=BusinessType.CHAIN_WITHDRAWAL,
        reference="test:hold",
    )
    body = h.ok(family.master.client.get(h.ASSET, {"email": "FAM-SUB1@test.example"}))
    assert set(body) == {"balances"}
    by_asset = {row["asset"]: row for row in body["balances"]}
    assert set(by_asset) == {"BTC", "PHP", "USDT"}
    for row in body["balances"]:
        assert set(row) == {"asset", "free", "locked"}
    assert by_asset["BTC"]["free"] == "0.40000000"
    assert by_asset["BTC"]["locked"] == "0.10000000"
    assert Decimal(by_asset["USDT"]["free"]) == Decimal(by_asset["USDT"]["locked"]) == 0


def test_email_is_required(family):
    assert_error(family.master.client.get(h.ASSET), -1105, 400)


def test_a_sibling_cannot_read_its_siblings_assets(family):
    assert_error(family.sub2.client.get(h.ASSET, {"email": family.sub1.user.email}), -1152, 401)
