"""A bounded, loud end for each async test's event loop.

asyncio's Runner.close() cancels the loop's remaining tasks once and then waits for them without a
limit: a task that turns its cancellation into another exception and retries (or a library that
swallows it) keeps the loop - and the whole test run - waiting for ever. In whole-suite runs that
happened at a streams test's teardown (pytest-timeout ended it after 300 s with only the threads'
stacks). Here the remaining tasks are cancelled again every second for up to TEARDOWN_SECONDS; a
task still running after that is reported with its coroutine's stack and the test errors."""

from __future__ import annotations

import asyncio
import asyncio.runners
import io

TEARDOWN_SECONDS = 10.0


SLOW_TEARDOWNS: list[int] = []  # rounds of cancellation that loops needed (more than one)


class StuckTasks(RuntimeError):
    pass


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    pending = asyncio.all_tasks(loop)
    if not pending:
        return
    everything = set(pending)
    rounds = 0
    while pending and rounds < TEARDOWN_SECONDS:
        for task in pending:
            task.cancel()
        _, pending = loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        rounds += 1
    for task in everything - pending:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during the event loop's shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )
    if pending:
        report = io.StringIO()
        for task in pending:
            task.print_stack(file=report)
        stuck = f"{len(pending)} task(s) ignored cancellation for {TEARDOWN_SECONDS:.0f} s"
        raise StuckTasks(f"{stuck}:\n{report.getvalue()}")
    if rounds > 1:
        SLOW_TEARDOWNS.append(rounds)


def install() -> None:
    asyncio.runners._cancel_all_tasks = _cancel_all_tasks
