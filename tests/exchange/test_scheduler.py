import time

import pytest

from accounts.models import LedgerCheckRun
from exchange.runtime.scheduler import start_embedded_scheduler


@pytest.mark.django_db(transaction=True)
def test_embedded_scheduler_runs_the_periodic_ledger_check():
    stop = start_embedded_scheduler({"ledger-check": {"task": "accounts.ledger_check", "schedule": 0.2}}, force=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and LedgerCheckRun.objects.count() < 2:
            time.sleep(0.1)
        runs = list(LedgerCheckRun.objects.all())
        assert len(runs) >= 2
        assert all(run.ok for run in runs)
    finally:
        stop.set()
        time.sleep(0.5)


def test_beat_schedule_declares_the_ledger_check(settings):
    assert settings.CELERY_BEAT_SCHEDULE["ledger-check"]["task"] == "accounts.ledger_check"
    from exchange.celery import app

    app.loader.import_default_modules()
    assert "accounts.ledger_check" in app.tasks
