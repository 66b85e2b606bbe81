"""exchange/runtime/outage.py: a dependency's outage in a few log lines, not one per failed request."""

from __future__ import annotations

import logging
import threading

import pytest

from exchange.runtime import outage as outage_module
from exchange.runtime.outage import Outage, WithoutServiceUnavailable

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
    outage.failed(ConnectionRefusedError("connection refused"))
    clock[0] += 2
    outage.failed(ConnectionRefusedError("connection refused"))
    clock[0] += 60  # a new outage a minute later: logged again as a new one
    outage.failed(ConnectionResetError("the database system is starting up"))
    assert _lines(caplog) == [
        "Database unavailable: ConnectionRefusedError: connection refused",
        "Database unavailable - the previous outage ended 60 s ago (it lasted 2.0 s, 2 failure(s), 1 not logged)",
        "Database unavailable: ConnectionResetError: the database system is starting up",
    ]
    assert all(r.exc_info is None for r in caplog.records if r.name == LOGGER)  # traceback=False


def test_threads_failing_at_once_log_the_start_once(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = Outage(logging.getLogger(LOGGER), "Store unavailable", every=60.0, settle=0.0)
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

    from exchange.runtime.outage import periodic

    caplog.set_level(logging.INFO, logger="exchange.periodic")
    failures = [OperationalError("the database system is shutting down"), RedisConnectionError("refused")]

    @periodic("chain-scan")
    def job() -> int:
        if failures:
            raise failures.pop(0)
        return 7

    assert job() is None  # the database away: logged, and the next tick runs it again
    assert job() is None  # Redis away: counted
    clock[0] += 1.5  # a tick later
    assert job() == 7  # back
    lines = [r.getMessage() for r in caplog.records if r.name == "exchange.periodic"]
    assert lines == [
        "Periodic job chain-scan could not reach the database or Redis; the next tick runs it again: "
        "OperationalError: the database system is shutting down",
        "Periodic job chain-scan could not reach the database or Redis; the next tick runs it again"
        " - over: back after 1.5 s, 2 failure(s) in all",
    ]

    @periodic("broken")
    def bug() -> None:
        raise ValueError("a defect, not an outage")

    with pytest.raises(ValueError, match="a defect"):
        bug()


def test_a_defect_is_logged_whole_every_time_and_not_counted(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = Outage(logging.getLogger(LOGGER), "Hub task failed", every=60.0)
    outage.failed(ConnectionError("redis away"))
    for _ in range(3):
        outage.failed(TypeError("a bug"))
    lines = _lines(caplog)
    assert lines == ["Hub task failed"] + ["Hub task failed (not an outage)"] * 3
    assert all(r.exc_info is not None for r in caplog.records if r.name == LOGGER)
    assert outage.down


def test_ok_ends_an_outage_only_once_failures_have_stopped(caplog, clock):
    caplog.set_level(logging.INFO, logger=LOGGER)
    outage = Outage(logging.getLogger(LOGGER), "Pool exhausted", every=10.0)
    outage.failed(ConnectionError("pool timeout"))
    clock[0] += 0.2
    outage.ok()  # another request got a connection meanwhile: the outage goes on
    outage.failed(ConnectionError("pool timeout"))
    assert outage.down
    assert _lines(caplog) == ["Pool exhausted"]
    clock[0] += 1.5
    outage.ok()
    assert not outage.down
    assert _lines(caplog)[-1] == "Pool exhausted - over: back after 1.7 s, 2 failure(s) in all"


def test_a_deadlock_is_this_requests_failure_not_a_database_outage(caplog, monkeypatch):
    """-1001 either way; a deadlock or serialization failure is logged per request and does not
    start (or hide inside) the database outage's summary lines."""
    import psycopg.errors
    from django.db import OperationalError

    from exchange.api import errors

    outage = Outage(errors.logger, errors.DATABASE_OUTAGE.what, level=logging.WARNING, traceback=False)
    monkeypatch.setattr(errors, "DATABASE_OUTAGE", outage)
    caplog.set_level(logging.INFO, logger=errors.logger.name)
    for _ in range(2):
        deadlock = OperationalError("deadlock detected")
        deadlock.__cause__ = psycopg.errors.DeadlockDetected("deadlock detected")
        assert errors._translate(deadlock, "POST").code == -1001
    assert not outage.down
    away = OperationalError("connection failed: Connection refused")
    away.__cause__ = psycopg.OperationalError("connection failed: Connection refused")
    assert errors._translate(away, "POST").code == -1001
    assert outage.down
    lines = [r.getMessage() for r in caplog.records if r.name == errors.logger.name]
    assert lines[:2] == ["Database refused this request (SQLSTATE 40P01): deadlock detected"] * 2
    assert lines[2].startswith(errors.DATABASE_OUTAGE.what)
