"""M1 of the security review (docs/security.md): a signed write is never run twice, even when the
replay store cannot be reached (refused, -1001) or has forgotten what it saw (a Redis restart
without persistence, a flush, a new embedded process: refused by the memory epoch, -1021)."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from accounts.ledger.check import ledger_check
from accounts.models import Balance
from exchange.api import ratelimit
from tests.support.assertions import assert_error
from tests.support.client import now_ms
from tests.support.factories import UserFactory, customer, fund
from wallet.models import Transfer

V4 = "/openapi/transfer/v4/transfers"
PEER = "peer@test.example"
SEVEN = {"account": "PHP", "target_address": PEER, "amount": "7.00"}


@pytest.fixture(autouse=True)
def _raised_limits(settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000


@pytest.fixture
def client(db):
    """A customer holding 1000 PHP, who sends 7.00 to PEER (who holds some already)."""
    fund(UserFactory(email=PEER), "PHP", "5000")
    return customer(funding={"PHP": "1000"}).client


def peer_php() -> Decimal:
    return Balance.objects.get(account__email=PEER, asset__code="PHP").free


def test_signed_writes_are_refused_while_the_replay_store_is_unreachable(client, settings):
    """The review's reproduction: Redis down, the same signed transfer of 7.00 sent twice."""
    settings.RATE_LIMIT_STORAGE_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    before = peer_php()
    stamp = now_ms()
    for _ in range(2):
        body = assert_error(client.post(V4, SEVEN, timestamp=stamp), -1001, 503)
        assert "not executed" in body["msg"]
    assert peer_php() == before
    assert Transfer.objects.count() == 0
    # Reads are still served (counting fails open: limits protect capacity, not money).
    assert client.get("/openapi/v1/account").status_code == 200
    assert ledger_check().ok


def test_a_replay_after_the_store_forgot_is_refused(client):
    stamp = now_ms()
    first = client.post(V4, SEVEN, timestamp=stamp)
    assert first.status_code == 200, first.content
    after_first = peer_php()
    ratelimit.storage().reset()  # a Redis restart without persistence: every signature forgotten
    body = assert_error(client.post(V4, SEVEN, timestamp=stamp), -1021, 400)
    assert "replay memory" in body["msg"]
    assert peer_php() == after_first
    assert Transfer.objects.count() == 1
    # Honest clients sign with a fresh timestamp: accepted once the store's memory covers it.
    time.sleep(ratelimit.MEMORY_MARGIN_MS / 1000 + 0.1)
    assert client.post(V4, SEVEN).status_code == 200
    assert peer_php() == after_first + Decimal(7)
    assert ledger_check().ok


def test_the_embedded_memory_store_refuses_what_a_previous_process_may_have_seen(client, settings):
    """A new embedded process starts with an empty memory store: its epoch is its start."""
    settings.RATE_LIMIT_STORAGE_URL = "memory://"
    counters = ratelimit.counters()
    counters.storage.reset()
    counters._memory_epoch = None  # as in a new process
    try:
        ratelimit.start_memory_epoch()
        captured = now_ms() - 500  # signed before this process started
        assert_error(client.post(V4, SEVEN, timestamp=captured), -1021, 400)
        assert Transfer.objects.count() == 0
        time.sleep(ratelimit.MEMORY_MARGIN_MS / 1000 + 0.1)
        stamp = now_ms()
        assert client.post(V4, SEVEN, timestamp=stamp).status_code == 200
        assert_error(client.post(V4, SEVEN, timestamp=stamp), -1022, 401)  # and then the ordinary replay check
        assert Transfer.objects.count() == 1
    finally:
        counters.reset()


def test_a_server_start_does_not_move_an_existing_epoch(settings):
    counters = ratelimit.counters()
    counters.set_memory_epoch(12345)
    ratelimit.start_memory_epoch()
    connection = counters.storage.get_connection()
    assert int(connection.get(counters._key(ratelimit.MEMORY_EPOCH_KEY))) == 12345
    counters.storage.reset()
    ratelimit.start_memory_epoch()
    assert abs(int(connection.get(counters._key(ratelimit.MEMORY_EPOCH_KEY))) - now_ms()) < 5000
