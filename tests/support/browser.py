"""A real browser for the back-office tests: Debian's Chromium (`make test` installs it like
PostgreSQL; never a browser download) driven by Playwright's sync API.

    with chromium() as browser:
        page = new_page(browser)
        login(page, live_server.url, staff.email, TEST_PASSWORD)
        screenshot(page, "dashboard")                     # var/artifacts/dashboard.png

The fixtures (`browser`, `page`) are thin wrappers in tests/backoffice/conftest.py. Playwright's
sync API cannot run inside a running asyncio loop, so the tests using it are plain (non-async)
tests with pytest-django's `live_server` (a server thread; the tests need
`@pytest.mark.django_db(transaction=True)` so that the server sees their rows). While Playwright is
started its loop counts as running on the test's thread, so Django refuses the test's own sync
database calls unless DJANGO_ALLOW_ASYNC_UNSAFE is set: the `browser` fixture sets it for its test
only.

Helpers for the admin's pages: `run_action` (tick rows of a changelist, choose an action, give the
reason, press Go), `post_as_page` (a POST with the page's session and CSRF token, as a crafted
request would be sent), `messages` (the admin's message list).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

# No network of its own (updates, sync, QUIC), no sandbox (root in CI containers), no GPU.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(settings.BASE_DIR) / "var" / "artifacts"  # gitignored (var/): screenshots of a run
TIMEOUT_MS = 15_000


def chromium_path() -> str | None:
    """Debian's Chromium (CHROMIUM_PATH to use another); None when none is installed."""
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
    return path if Path(path).exists() else None


@contextmanager
def chromium() -> Iterator:
    """A started headless Chromium (a Playwright `Browser`), closed on exit."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    if executable is None:
        raise RuntimeError("Chromium is not installed: `make services` installs Debian's chromium package.")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser, *, viewport: tuple[int, int] = (1400, 1000)):
    """A page in a fresh context (its own cookies: one staff member per context)."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    context.set_default_timeout(TIMEOUT_MS)
    return context.new_page()


def login(page, base_url: str, username: str, password: str, *, expect_success: bool = True) -> None:
    """Log in on the admin's login page as a person would: type, click, wait for the next page."""
    page.goto(f"{base_url.rstrip('/')}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_load_state()
    if expect_success and re.search(r"/admin/login/", page.url):
        errors = page.locator(".errornote, .errorlist").all_inner_texts()
        raise AssertionError(f"login as {username} failed: {errors}")


def logout(page, base_url: str) -> None:
    """Log out by the admin's own form (a POST with the CSRF token)."""
    page.goto(f"{base_url.rstrip('/')}/admin/")
    page.click("#logout-form button[type=submit]")
    page.wait_for_load_state()


def screenshot(page, name: str, *, full_page: bool = True) -> Path:
    """Save a PNG under var/artifacts/ (a test artifact, never committed) and return its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def run_action(page, base_url: str, changelist: str, action: str, pks, reason: str | None) -> None:
    """On a changelist (a path like /admin/wallet/withdrawal/), tick `pks`, choose `action`, type the
    reason and press Go, as a person would."""
    page.goto(f"{base_url.rstrip('/')}{changelist}")
    for pk in pks:
        page.check(f'input.action-select[value="{pk}"]')
    page.select_option('select[name="action"]', action)
    if reason is not None:
        page.fill('input[name="reason"]', reason)
    page.click('button[name="index"]')
    page.wait_for_load_state()


def messages(page) -> list[str]:
    return page.locator("ul.messagelist li").all_inner_texts()


def csrf_token(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def post_as_page(page, url: str, form: dict):
    """POST `form` with the page's cookies (its staff session) and CSRF token: what a crafted request
    by that staff member would send, bypassing the page's buttons. Returns Playwright's response."""
    return page.request.post(
        url, form={**form, "csrfmiddlewaretoken": csrf_token(page)}, headers={"Referer": url}, max_redirects=0
    )
