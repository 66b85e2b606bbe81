"""The per-process caches of convert's reference data (the enabled pairs with their assets and
markets, the business status; exchange/runtime/ttlcache.py ReferenceCache): a change made anywhere reaches
another process within REFERENCE_REVOCATION_SECONDS. The other process is a real one
(tests/convert/cache_worker.py) on the same test database and Redis, with REFERENCE_CACHE_SECONDS at
60 so that only the invalidation can deliver the change in time; and the control shows that it
really answers from its cache (a change that bypasses the invalidation is not seen)."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection

from convert.models import Pair
from exchange.backoffice import changes
from exchange.backoffice.roles import ADMINISTRATOR
from exchange.platform.services import business_status_set
from exchange.runtime import ttlcache
from exchange.runtime.ttlcache import ReferenceCache, _VersionWatcher
from tests.convert.helpers import SUSPENDED
from tests.support.factories import customer
from tests.support.other_process import NEEDS_POSTGRESQL, OtherProcess, seconds_after
from tests.support.staff import staff_member
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def other_process(convert_world):
    if connection.vendor != "postgresql":
        pytest.skip(NEEDS_POSTGRESQL)
    user = customer().user
    other = OtherProcess("tests.convert.cache_worker", str(user.pk), env={"CONVERT_QUOTE_INTERVAL_MS": "0"})
    # Warm: its second quote asks the ORM nothing (pairs, markets, assets and the business status
    # come from its caches; the price book and the insert are prepared statements).
    assert other.ask("warm") == ["warm", "0"]
    yield other
    other.close()


def _btc_pair() -> Pair:
    return Pair.objects.get(source__code="PHP", target__code="BTC")


def _within_the_bound(answer: list[str], committed: float, message: str, capsys, what: str) -> None:
    assert answer[0] == "refused", f"the other process still quoted on the old {what} after 5 s"
    assert answer[2] == message
    assert seconds_after(answer, committed, what, capsys) < settings.REFERENCE_REVOCATION_SECONDS


def test_a_raised_minimum_reaches_another_process_within_the_bound(other_process, capsys):
    """An Administrator raises the pair's minimum above 100 PHP (a tightening: applied at once by
    the four-eyes path); the other process's next quotes of 100 PHP are refused within the bound."""
    admin = staff_member(ADMINISTRATOR)

    def raise_minimum() -> None:
        outcome = changes.change_submit(
            actor=admin, obj=_btc_pair(), changes={"min_source_amount": Decimal(500)}, reason="ticket 29"
        )
        assert outcome.request is None  # applied, not proposed

    answer, committed = other_process.watch(raise_minimum)
    _within_the_bound(answer, committed, "sourceAmount is below the minimum 500", capsys, "pair minimum")


def test_a_disabled_pair_reaches_another_process_within_the_bound(other_process, capsys):
    def disable() -> None:  # a queryset update: no signal, the manager invalidates
        Pair.objects.filter(pk=_btc_pair().pk).update(enabled=False)

    answer, committed = other_process.watch(disable)
    _within_the_bound(answer, committed, "the pair PHP to BTC is not supported", capsys, "pair disabled")


def test_convert_switched_off_reaches_another_process_within_the_bound(other_process, capsys):
    answer, committed = other_process.watch(lambda: business_status_set(business_type="CONVERT", is_on=False))
    _within_the_bound(answer, committed, SUSPENDED, capsys, "business status")


def test_the_other_process_answers_from_its_cache(other_process):
    """The control: a change that bypasses the invalidation (raw SQL) is not seen by the other
    process past the bound, so the tests above measure the invalidation, not a database read."""

    def behind_the_caches_back() -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE convert_pair SET min_source_amount = 500 WHERE id = %s", [_btc_pair().pk])

    answer, _ = other_process.watch(behind_the_caches_back, seconds=2 * settings.REFERENCE_REVOCATION_SECONDS)
    assert answer[0] == "unchanged"


class _Loads:
    """A load function that counts its calls (each one stands for a database read)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> int:
        self.count += 1
        return self.count


def _cached(cache: ReferenceCache, loads: _Loads) -> bool:
    before = loads.count
    cache.get("k", loads)
    return loads.count == before


def test_a_process_that_cannot_read_the_version_stops_trusting_its_cache(monkeypatch):
    """E.g. Redis unreachable from this process, or its reader starved: a change could be missed, so
    values come from the database until the version is read again."""
    watcher = _VersionWatcher()  # its own reader thread, as in another process
    cache, loads = ReferenceCache("test", watcher), _Loads()
    wait_until(lambda: _cached(cache, loads), what="the cache to be trusted")

    def unreachable():
        raise ConnectionError("Redis unreachable")

    real_client = ttlcache._version_client
    monkeypatch.setattr(ttlcache, "_version_client", unreachable)
    cut_off = time.monotonic()
    wait_until(lambda: not _cached(cache, loads), what="the cache to stop being trusted")
    # Trusted at most REFERENCE_REVOCATION_SECONDS after the last read, which started before the cut.
    assert watcher.trust_until <= cut_off + settings.REFERENCE_REVOCATION_SECONDS
    monkeypatch.setattr(ttlcache, "_version_client", real_client)
    wait_until(lambda: _cached(cache, loads), what="the cache to be trusted again")


def test_a_redis_that_lost_its_data_clears_the_caches():
    watcher = _VersionWatcher()
    cache, loads = ReferenceCache("test", watcher), _Loads()
    wait_until(lambda: _cached(cache, loads), what="the cache to be trusted")
    ttlcache._version_client().delete(ttlcache.REFERENCE_VERSION_KEY)  # Redis restarted empty
    watcher.sync()
    assert not _cached(cache, loads)
