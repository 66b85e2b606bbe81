"""What a quote and an accept ask the database, statement by statement (issue 29: the enabled pairs,
markets, assets and the business status come from per-process caches, exchange/runtime/ttlcache.py; the
accept's quote is one prepared statement; nothing is loaded lazily). Django's query log counts the
ORM's statements; the prepared ones (accounts/ledger/posting/prepared.py) go through a plain psycopg
cursor with prepare=True and are counted here at that cursor."""

from __future__ import annotations

import time
from decimal import Decimal

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from convert import services
from exchange.runtime.ttlcache import versions
from tests.support.factories import customer
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL prepared statements"),
    # as a request runs: outside any transaction (what a test's transaction would load is not cached)
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def prepared(monkeypatch) -> list[str]:
    """The text of every prepared statement run from now on (the real cursor runs each one)."""
    statements: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self, query, params=None, **kwargs):
        if kwargs.get("prepare"):
            statements.append(query)
        return execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return statements


@pytest.fixture
def warm(convert_world):
    """An account that quoted and accepted once: the process's caches hold the pairs and the
    business status (as in a serving process after its first conversion)."""
    user = customer(funding={"PHP": "100000"}).user
    # The setup's changes (assets, pairs) reach this process's version reader too: once it has read
    # the version after them, nothing clears the caches in the middle of a measured call.
    versions.ensure_reader()
    moment = time.monotonic()
    wait_until(
        lambda: versions.trust_until > moment + settings.REFERENCE_REVOCATION_SECONDS,
        what="a read of the reference version after the setup",
    )
    first = services.quote_create(user=user, source_code="PHP", target_code="BTC", source_amount=Decimal(100))
    services.quote_accept(user=user, quote_id=first.quote_id)
    return user


def _just_read() -> None:
    """Until the version reader has just read (its trust runs 0.75 s more): a cache hit needs a read
    younger than REFERENCE_REVOCATION_SECONDS, and on a loaded machine the reader thread can fall
    behind, so that a measured call would reload what it had cached (seen once: 2 ORM queries)."""
    wait_until(
        lambda: versions.trust_until > time.monotonic() + 0.75 * settings.REFERENCE_REVOCATION_SECONDS,
        what="a fresh read of the reference version",
    )


def test_a_quote_reads_the_prices_and_inserts_the_quote(warm, django_assert_num_queries, prepared):
    # Two prepared statements, nothing through the ORM: 1. the price book, every asset's price in
    # the numeraire (it changes every tick, so it is read per request; the arbitrage verdict is
    # cached per book); 2. the INSERT of the quote.
    # Not asked: the business status, the pair with its assets and market (cached per process).
    _just_read()
    with django_assert_num_queries(0):
        services.quote_create(user=warm, source_code="PHP", target_code="BTC", source_amount=Decimal(100))
    assert len(prepared) == 2, prepared
    assert "FROM convert_assetprice" in prepared[0]
    assert prepared[1].startswith("INSERT INTO convert_quote")


def test_an_accept_reads_its_quote_once_and_posts(warm, django_assert_num_queries, prepared):
    quote = services.quote_create(user=warm, source_code="PHP", target_code="BTC", source_amount=Decimal(100))
    prepared.clear()
    # Through the ORM only BEGIN and COMMIT of the posting's transaction. Prepared: 1. the quote
    # with whether it has an order; 2. the price book (the last look); then the ledger's two
    # (accounts/ledger/posting/postgres.py): 3. lock the ledger accounts of the legs, 4. one
    # statement writing the posting, its entries and balances and the order row.
    # Not asked: the pair, its assets and market, the business status (cached per process), the
    # liquidity shard's account (cached by the ledger), the order's existence (in statement 1).
    _just_read()
    with django_assert_num_queries(2) as captured:
        order = services.quote_accept(user=warm, quote_id=quote.quote_id)
    assert order.status == "SUCCESS"
    assert [q["sql"] for q in captured.captured_queries] == ["BEGIN", "COMMIT"]
    assert "FROM convert_quote q LEFT JOIN convert_order o" in prepared[0]
    assert "FROM convert_assetprice" in prepared[1]
    assert "FROM accounts_ledgeraccount" in prepared[2]
    assert "convert_order" in prepared[3]
    assert not any("convert_quote" in sql for sql in prepared[1:])  # the quote is read once
    assert len(prepared) == 4, [sql[:60] for sql in prepared]
