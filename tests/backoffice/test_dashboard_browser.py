"""The dashboard and the customer page in a real browser (Debian's Chromium through Playwright,
tests/support/browser.py): a Support member logs in with the login form and lands on the
dashboard (issue 26), the activity chart is drawn by the vendored Chart.js (the Chart instance exists
and the canvas has ink), the numbers on the page equal the ledger's, then finds a customer by the
search form. Screenshots: var/artifacts/dashboard.png and var/artifacts/customer.png."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.ledger.models import Balance
from accounts.models import User
from exchange.backoffice.roles import SUPPORT
from streams import services as stream_services
from tests.support.browser import login, screenshot
from tests.support.factories import TEST_PASSWORD, demo_accounts, deposit
from tests.support.staff import staff_member
from wallet.transfers import services as transfer_services

pytestmark = pytest.mark.django_db(transaction=True)  # the live server's thread sees the test's rows

MASTER = "master@demo.exchange"

CANVAS_INK = """(id) => {
    const canvas = document.getElementById(id);
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let inked = 0;
    for (let i = 3; i < data.length; i += 4) { if (data[i] !== 0) { inked++; } }
    return {inked: inked, width: canvas.width, height: canvas.height};
}"""


def test_support_sees_the_dashboard_chart_and_a_customer(live_server, page, settings):
    settings.TRAVEL_RULE_THRESHOLD = Decimal(0)
    demo_accounts(wallet=True)  # the demo's accounts, networks and whitelist, by the factories
    master = User.objects.get(email=MASTER)
    deposit(master, "1.5", "BTC")  # activity today: the chart has a bar
    transfer_services.transfer_create(  # and the customer page has a transfer and a listenKey
        sender=master, asset_code="PHP", target_address="peer@demo.exchange", amount=Decimal("5")
    )
    stream_services.listen_key_start(account=master)
    staff = staff_member(SUPPORT)

    login(page, live_server.url, staff.email, TEST_PASSWORD)
    assert page.url.rstrip("/").endswith("/admin")  # the first page after login is the dashboard
    page.wait_for_selector("#activity-counts")
    page.wait_for_function("() => window.backofficeCharts && window.backofficeCharts.counts")
    assert page.evaluate("() => Chart.version").startswith("4.")
    assert page.evaluate("() => window.backofficeCharts.counts.data.datasets.length") == 4
    today_deposits = page.evaluate("() => window.backofficeCharts.counts.data.datasets[0].data.at(-1)")
    assert today_deposits >= 1
    ink = page.evaluate(CANVAS_INK, "activity-counts")
    assert ink["width"] > 0, ink
    assert ink["inked"] > 1000, ink  # drawn: axes, labels and bars
    assert page.evaluate(CANVAS_INK, "activity-volume-BTC")["inked"] > 1000
    # the numbers as the browser shows them are the ledger's
    customers_btc = sum(
        (b.free + b.locked for b in Balance.objects.filter(asset__code="BTC", account__system_role__isnull=True)),
        Decimal(0),
    )
    shown = page.inner_text('#positions tr[data-asset="BTC"] td[data-field="customers_total"]')
    assert Decimal(shown) == customers_btc
    assert page.inner_text("#ledger-check")  # shown (red: no check recorded in this database yet)
    assert page.get_attribute("#ledger-check", "class") == "bo-alarm"
    path = screenshot(page, "dashboard")
    assert path.stat().st_size > 10_000

    page.click("#dashboard a:text('Customer page')")
    page.fill("#q", MASTER)
    page.click("#customer-search input[type=submit]")
    page.wait_for_selector("#balances")
    assert MASTER in page.inner_text("#account")
    btc = Balance.objects.get(account=master, asset__code="BTC")
    assert Decimal(page.inner_text('#balances tr[data-asset="BTC"] td[data-field="free"]')) == btc.free
    assert page.locator("#postings tr[data-posting]").count() > 0
    assert "peer@demo.exchange" in page.inner_text("#transfers")
    assert page.locator("#listen-keys tbody tr").count() == 1
    path = screenshot(page, "customer")
    assert path.stat().st_size > 10_000
