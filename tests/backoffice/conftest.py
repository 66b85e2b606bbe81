"""Fixtures of the back-office tests: thin wrappers around tests/support/browser.py and staff.py.

`browser`: a headless Chromium (Debian's) for one test; `page`: a fresh context and page in it;
`staff(role)`: a staff member in a role with the test password (tests.support.staff.staff_member).
Browser tests also take pytest-django's `live_server` and `@pytest.mark.django_db(transaction=True)`.
"""

from __future__ import annotations

import pytest
from django.db import connections

from tests.support import browser as browser_support
from tests.support.staff import staff_member


@pytest.fixture
def browser(monkeypatch):
    """One test's Chromium. Per test, not per session: while Playwright's sync API is started, its
    event loop counts as running on this thread, and Django then refuses sync database calls
    (SynchronousOnlyOperation) - the test's own, which are plain sync code outside that loop. So
    DJANGO_ALLOW_ASYNC_UNSAFE is set for this test only (never in the service's settings) and the
    loop is gone before the next test, whose database calls keep Django's check."""
    if browser_support.chromium_path() is None:
        pytest.fail("Chromium is not installed: `make services` installs Debian's chromium package.")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with browser_support.chromium() as started:
        try:
            yield started
        finally:
            # While that loop runs, asgiref's Local (Django's `connections`) keeps this thread's
            # connections in the context, not the thread: the test's database calls open a
            # connection that pytest-django, closing the thread's after the loop is gone, never
            # sees. Closed here, while the loop still runs (it was left open until the run's end).
            connections.close_all()


@pytest.fixture
def page(browser):
    made = browser_support.new_page(browser)
    yield made
    made.context.close()


@pytest.fixture
def staff(db):
    """`staff(role, email=None)`: a staff member in `role` (tests.support.staff.ROLES)."""
    return staff_member
