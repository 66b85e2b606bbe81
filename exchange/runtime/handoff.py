"""How a service hands committed work to its Celery task without importing the task (the task module
imports the service, so the other way round would close a cycle: tests/test_dependencies.py). The
service's module holds a `WorkerHandOff`; its tasks module, loaded by the app's ready(), registers the
task with `set_worker`; the service calls `after_commit(id)` inside its transaction."""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction


class WorkerHandOff:
    def __init__(self, *, tasks_module: str, what: str) -> None:
        self._tasks_module = tasks_module
        self._what = what
        self._hand_over: Callable[[int], object] | None = None

    def set_worker(self, hand_over: Callable[[int], object]) -> None:
        self._hand_over = hand_over

    def after_commit(self, work_id: int) -> None:
        """Hand `work_id` to a worker once the caller's transaction commits. Robust: with the broker
        down the work stays committed and waiting, and the app's periodic sweep of stuck work hands
        it over later."""
        if (hand_over := self._hand_over) is None:
            raise RuntimeError(f"{self._tasks_module} is not loaded: no worker to hand {self._what} to")
        transaction.on_commit(lambda: hand_over(work_id), robust=True)
