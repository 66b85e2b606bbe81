"""The ledger check's zero-sum rules (accounts/ledger/check.py) fire: a posting whose entries do not
sum to zero per asset, and a book that does not, are reported with the posting, the asset and the
amount. On PostgreSQL the database refuses such a posting (the statement trigger of migration 0010),
so the test switches that trigger off inside its own transaction (rolled back with the test); SQLite
has no such trigger. Runs on both (Makefile's EMBEDDED_TESTS): each vendor has its own summing path."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.models import Asset, Entry, Posting, SystemRole

pytestmark = pytest.mark.django_db


@pytest.fixture
def assets(db):
    return {code: Asset.objects.create(code=code, name=code, transfer_precision=8) for code in ("BTC", "ETH")}


@pytest.fixture
def unguarded(db):
    """The database's zero-sum trigger off for this test's transaction (rolled back after it); off
    before the test writes any entry (PostgreSQL alters no table with pending trigger events)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE accounts_entry DISABLE TRIGGER entry_statement_sums_to_zero")


def bad_posting(reference: str, entries: list[tuple[int, Asset, int, str]]) -> int:
    """A posting with the free-bucket entries (account, asset, side, amount) as given, balanced or
    not (the `unguarded` fixture lets it past the database); its id."""
    posting = Posting.objects.create(kind="OTHERS", reference=reference, memo="", created_at=timezone.now())
    Entry.objects.bulk_create(
        Entry(posting=posting, account_id=account, asset=asset, bucket="F", side=side, amount=Decimal(amount))
        for account, asset, side, amount in entries
    )
    return posting.pk


def zero_sum_problems() -> dict[str, Decimal]:
    """The check's zero-sum lines, 'posting #N ... in CODE' / 'the book ... in CODE' -> amount."""
    found = {}
    for line in ledger_check().problems:
        matched = re.fullmatch(r"(.*) does not sum to zero in (\w+): (\S+)", line)
        if matched:
            found[f"{matched[1]} in {matched[2]}"] = Decimal(matched[3])
    return found


def test_a_sound_book_has_no_zero_sum_problem(make_user, assets):
    alice = make_user().id
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, alice, "BTC", Decimal("2.5")), kind="CHAIN_DEPOSIT", reference="dep:1")
    assert ledger_check().ok
    assert zero_sum_problems() == {}


def test_a_posting_that_does_not_sum_to_zero_is_reported_with_the_book(unguarded, make_user, assets):
    alice = make_user().id
    posting = bad_posting("bad:credit", [(alice, assets["BTC"], 1, "1.25")])

    assert zero_sum_problems() == {
        f"posting #{posting} in BTC": Decimal("1.25"),
        "the book in BTC": Decimal("1.25"),
    }
    assert not ledger_check().ok


def test_the_rule_is_per_asset_and_the_book_is_summed_across_postings(unguarded, make_user, assets):
    """+1 BTC -1 ETH sums to zero only across assets: the posting is reported in both. Two postings
    that are off by +0.5 and -0.5 BTC are each reported, while the BTC book as a whole sums to zero."""
    alice, bob = make_user().id, make_user().id
    cross = bad_posting("bad:cross", [(alice, assets["BTC"], 1, "1"), (bob, assets["ETH"], -1, "1")])
    up = bad_posting("bad:up", [(alice, assets["BTC"], 1, "1.5"), (bob, assets["BTC"], -1, "1")])
    down = bad_posting("bad:down", [(alice, assets["BTC"], -1, "1"), (bob, assets["BTC"], 1, "0.5")])

    assert zero_sum_problems() == {
        f"posting #{cross} in BTC": Decimal("1"),
        f"posting #{cross} in ETH": Decimal("-1"),
        f"posting #{up} in BTC": Decimal("0.5"),
        f"posting #{down} in BTC": Decimal("-0.5"),
        "the book in BTC": Decimal("1"),  # the cross posting's +1; up and down cancel
        "the book in ETH": Decimal("-1"),
    }
