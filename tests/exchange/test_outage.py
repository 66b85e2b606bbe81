"""exchange/outage.py: a dependency's outage in a few log lines, not one per failed request."""

from __future__ import annotations

import logging
import threading

import pytest

from exchange import outage as outage_module
from exchange.outage import Outage, WithoutServiceUnavailable

LOGGER = "tests.outage"


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(outage_module.time, "monotonic", lambda: now[0])
    return now


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_an_outage_is_its_first_failure_a_line_every_interval_and_its_end(caplog, clock):
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = Outage(logging.getLogger(LOGGER), "Store unavailable", every=10.0)
    outage.ok()  # nothing failing: nothing logged
    assert _lines(caplog) == []
    for second in range(25):  # 100 failures a second for 25 s
        clock[0] = 1000.0 + second
        for _ in range(100):
            outage.failed(ConnectionError("refused"))
    lines = _lines(caplog)
    assert lines[0] == "Store unavailable"
    assert caplog.records[0].exc_info is not None  # the first one has its traceback
    assert lines[1:] == [
        "Store unavailable - still failing after 10 s (1000 more since the last line): ConnectionError: refused",
        "Store unavailable - still failing after 20 s (1000 more since the last line): ConnectionError: refused",
    ]
    clock[0] = 1025.5
    outage.ok()
    outage.ok()
    assert _lines(caplog)[3:] == ["Store unavailable - over: back after 25.5 s, 2500 failure(s) in all"]
    assert not outage.down


def test_without_ok_an_outage_ends_after_a_quiet_interval(caplog, clock):
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = Outage(logging.getLogger(LOGGER), "Database unavailable", every=10.0, traceback=False)
    outage.failed(OSError("connection refused"))
    clock[0] += 2
    outage.failed(OSError("connection refused"))
    clock[0] += 60  # a new outage an hour... a minute later: logged again as a new one
    outage.failed(OSError("the database system is starting up"))
    assert _lines(caplog) == [
        "Database unavailable: OSError: connection refused",
        "Database unavailable - the previous outage ended 60 s ago (it lasted 2.0 s, 2 failure(s), 1 not logged)",
        "Database unavailable: OSError: the database system is starting up",
    ]
    assert all(r.exc_info is None for r in caplog.records if r.name == LOGGER)  # traceback=False


def test_threads_failing_at_once_log_the_start_once(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = Outage(logging.getLogger(LOGGER), "Store unavailable", every=60.0)
    start = threading.Barrier(16)

    def fail() -> None:
        start.wait()
        for _ in range(200):
            outage.failed(ConnectionError("refused"))

    threads = [threading.Thread(target=fail) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _lines(caplog) == ["Store unavailable"]
    outage.ok()
    assert _lines(caplog)[-1].endswith("3200 failure(s) in all")


def test_django_request_drops_503_refusals_and_keeps_other_5xx():
    keep = WithoutServiceUnavailable()
    record = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "Service Unavailable: %s", ("/x",), None)
    record.status_code = 503
    assert not keep.filter(record)
    record.status_code = 500
    assert keep.filter(record)
    assert logging.getLogger("django.request").filters, "settings.LOGGING installs the filter"


def test_a_periodic_job_rides_out_an_outage_and_still_raises_its_own_errors(caplog, clock):
    from django.db import OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError

    from exchange.outage import periodic

    caplog.set_level(logging.INFO, logger="exchange.periodic")
    failures = [OperationalError("the database system is shutting down"), RedisConnectionError("refused")]

    @periodic("chain-scan")
    def job() -> int:
        if failures:
            raise failures.pop(0)
        return 7

    assert job() is None  # the database away: logged, and the next tick runs it again
    assert job() is None  # Redis away: counted
    assert job() == 7  # back
    lines = [r.getMessage() for r in caplog.records if r.name == "exchange.periodic"]
    assert lines == [
        "Periodic job chain-scan could not reach the database or Redis; the next tick runs it again: "
        "OperationalError: the database system is shutting down",
        "Periodic job chain-scan could not reach the database or Redis; the next tick runs it again"
        " - over: back after 0.0 s, 2 failure(s) in all",
    ]

    @periodic("broken")
    def bug() -> None:
        raise ValueError("a defect, not an outage")

    with pytest.raises(ValueError, match="a defect"):
        bug()
