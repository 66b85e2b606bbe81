"""Periodic jobs in the embedded default (`make run` without Redis): the Celery beat schedule run
by a thread of the server process, each task executed in-process. In the full stack Celery beat
runs the same schedule (settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

import logging
import threading
import time

from celery import Celery, current_app
from django.conf import settings
from django.db import close_old_connections

logger = logging.getLogger(__name__)
_started = threading.Lock()
_running: threading.Event | None = None


def start_embedded_scheduler(
    schedule: dict | None = None, *, force: bool = False, app: Celery | None = None
) -> threading.Event | None:
    """Start once per process, only where tasks run in-process (no broker). Returns an event that
    stops the thread when set. `app`: the Celery app whose tasks run (the asgi module passes the
    project's; by default the current one, which the project's is once exchange/celery.py loaded)."""
    global _running
    if not force and (not settings.CELERY_TASK_ALWAYS_EAGER or not settings.EMBEDDED_SCHEDULER):
        return None
    with _started:
        if _running is not None and not force:
            return None
        stop = threading.Event()
        _running = stop
    entries = dict(schedule if schedule is not None else settings.CELERY_BEAT_SCHEDULE)
    threading.Thread(
        target=_run, args=(app or current_app, entries, stop), name="embedded-scheduler", daemon=True
    ).start()
    return stop


def _seconds(schedule) -> float:
    return schedule.total_seconds() if hasattr(schedule, "total_seconds") else float(schedule)


def _run(app: Celery, entries: dict, stop: threading.Event) -> None:
    app.loader.import_default_modules()  # the apps' tasks modules (autodiscovery is lazy)
    next_run = {name: time.monotonic() + _seconds(entry["schedule"]) for name, entry in entries.items()}
    while not stop.is_set():
        now = time.monotonic()
        for name, entry in entries.items():
            if now < next_run[name]:
                continue
            next_run[name] = now + _seconds(entry["schedule"])
            try:
                app.tasks[entry["task"]].apply(args=entry.get("args", ()), throw=True)
            except Exception:
                logger.exception("Periodic job %s failed", name)
            finally:
                close_old_connections()
        stop.wait(0.2)
