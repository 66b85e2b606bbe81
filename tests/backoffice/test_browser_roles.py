"""The back office as staff use it: Debian's Chromium, driven by Playwright, against the live
server. Each role logs in on the login page and lands on the dashboard (the model index one click
away); Support sees the pages but no action; Treasury approves a withdrawal that settles, fills
travel-rule data that credits a held deposit, and proposes an adjustment that an Administrator
confirms (and that the proposer cannot); an Administrator creates an API key, sees its secret once,
and lifts a ban. Every money result is checked in the ledger.
Screenshots go to var/artifacts/ (not committed)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from accounts.ledger.models import AdjustmentStatus, ManualAdjustment
from accounts.models import ApiKey
from exchange.api.models import RateLimitBan
from exchange.backoffice.models import StaffAction
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.backoffice import awaiting_withdrawal, banned_ip, held_deposit, usdt_customer
from tests.support.browser import login, messages, post_as_page, run_action, screenshot
from tests.support.client import SignedClient
from tests.support.factories import TEST_PASSWORD, AssetFactory, UserFactory
from tests.support.staff import ADMINISTRATOR, ROLES, SUPPORT, TREASURY, staff_member
from wallet.models import DepositStatus, WithdrawalStage

pytestmark = pytest.mark.django_db(transaction=True)

WITHDRAWALS = "/admin/wallet/withdrawal/"
BANS = "/admin/exchange/ratelimitban/"
PING = "/openapi/v1/ping"


def _login(page, live_server, role: str):
    member = staff_member(role)
    login(page, live_server.url, member.email, TEST_PASSWORD)
    return member


@pytest.mark.parametrize("role", ROLES)
def test_each_role_lands_on_the_dashboard_with_the_models_one_click_away(page, live_server, role):
    member = _login(page, live_server, role)
    # The first page after login (issue 26): the dashboard, what is wrong and what waits for a person.
    assert page.url.rstrip("/").endswith("/admin")
    assert member.email.upper() in page.inner_text("#user-tools").upper()
    assert page.locator("#dashboard #ledger-check").count() == 1
    assert page.locator("#dashboard #queues").count() == 1
    screenshot(page, f"first-page-{role.lower()}")
    # Django's model index, one click away.
    page.click("#all-models")
    page.wait_for_load_state()
    assert page.url.rstrip("/").endswith("/admin/models")
    assert page.locator("#content-main .app-wallet").count() == 1
    assert page.locator("#backoffice-links a:text('Dashboard')").count() == 1  # and back
    screenshot(page, f"models-{role.lower()}")
    # Every role reads withdrawals; the audit trail is readable too.
    page.goto(f"{live_server.url}{WITHDRAWALS}")
    assert page.locator("#changelist").count() == 1
    page.goto(f"{live_server.url}/admin/exchange/staffaction/")
    assert page.locator("#changelist").count() == 1


def test_support_sees_no_action_buttons_and_cannot_post_actions(page, live_server):
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    ban = banned_ip()
    api_key = ApiKey.objects.get(user=alice.user)
    _login(page, live_server, SUPPORT)
    base = live_server.url

    # Change lists: rows, but no action bar and no "Add" button.
    for changelist in (
        WITHDRAWALS,
        "/admin/wallet/deposit/",
        BANS,
        "/admin/accounts/apikey/",
        "/admin/accounts/user/",
        "/admin/accounts/manualadjustment/",
        "/admin/exchange/businessstatus/",
    ):
        page.goto(f"{base}{changelist}")
        assert page.locator("#changelist").count() == 1, changelist
        assert page.locator('select[name="action"]').count() == 0, changelist
        assert page.locator("a.addlink").count() == 0, changelist
    screenshot(page, "support-changelist-no-actions")
    # Change forms: read-only, no save or delete buttons.
    for change in (
        f"{WITHDRAWALS}{withdrawal.pk}/change/",
        f"/admin/accounts/apikey/{api_key.pk}/change/",
        f"/admin/accounts/user/{alice.user.pk}/change/",
    ):
        page.goto(f"{base}{change}")
        assert page.locator('input[name="_save"], a.deletelink').count() == 0, change
        assert page.locator('input[name="reason"]').count() == 0, change

    # Crafted posts with Support's session and CSRF token change nothing.
    approve = post_as_page(
        page,
        f"{base}{WITHDRAWALS}",
        {"action": "approve", "_selected_action": str(withdrawal.pk), "index": "0", "reason": "support tries"},
    )
    assert approve.status in (200, 302, 403)  # 200: the list again, the action not offered to Support
    lift = post_as_page(
        page, f"{base}{BANS}", {"action": "lift_bans", "_selected_action": str(ban.pk), "index": "0", "reason": "x"}
    )
    assert lift.status in (200, 302, 403)
    withdrawal.refresh_from_db()
    ban.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert ban.lifted_at is None
    assert not StaffAction.objects.exists()
    assert_balance(alice.user, "USDT", "89", locked="11")
    assert_ledger_balanced()


def test_treasury_approves_a_withdrawal_that_settles(page, live_server):
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    treasurer = _login(page, live_server, TREASURY)

    # Without a reason the action is refused and nothing moves.
    run_action(page, live_server.url, WITHDRAWALS, "approve", [withdrawal.pk], reason=None)
    assert any("reason is required" in m for m in messages(page)), messages(page)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL

    run_action(page, live_server.url, WITHDRAWALS, "approve", [withdrawal.pk], reason="address checked with customer")
    assert any("Approved 1 withdrawal(s)." in m for m in messages(page)), messages(page)
    screenshot(page, "treasury-withdrawal-approved")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED  # broadcast and settled (eager worker, simulated chain)
    assert withdrawal.decided_by == treasurer
    assert withdrawal.tx_id
    assert_balance(alice.user, "USDT", "89", locked="0")  # 10 sent + 1 fee left the account
    assert_ledger_balanced()
    record = StaffAction.objects.get(action="withdrawal.approve")
    assert (record.actor, record.object_id) == (treasurer, str(withdrawal.pk))
    assert record.reason == "address checked with customer"


def test_treasury_fills_travel_rule_data_and_the_deposit_credits(page, live_server):
    alice = usdt_customer("0")
    deposit = held_deposit(alice.user, "20")
    _login(page, live_server, TREASURY)
    page.goto(f"{live_server.url}/admin/wallet/deposit/{deposit.pk}/change/")
    page.click("text=Fill travel-rule data")
    page.fill("#id_originator_name", "Juan dela Cruz")
    page.fill("#id_originator_vasp", "Other VASP")
    page.fill("#id_reason", "originator VASP message 2024-118")
    page.click('input[type="submit"]')
    page.wait_for_load_state()
    assert any("Travel-rule data saved" in m for m in messages(page)), messages(page)
    screenshot(page, "treasury-travel-rule-filled")
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert deposit.travel_rule_data["originator_name"] == "Juan dela Cruz"
    assert_balance(alice.user, "USDT", "20")
    assert_ledger_balanced()
    assert StaffAction.objects.get(action="deposit.travel_rule").reason == "originator VASP message 2024-118"


def test_treasury_proposes_an_adjustment_the_proposer_cannot_confirm_an_administrator_does(browser, live_server):
    from tests.support.browser import new_page

    alice = UserFactory()
    btc = AssetFactory(code="BTC")
    treasury_page, admin_page = new_page(browser), new_page(browser)
    treasurer = _login(treasury_page, live_server, TREASURY)
    admin = _login(admin_page, live_server, ADMINISTRATOR)

    treasury_page.goto(f"{live_server.url}/admin/accounts/manualadjustment/add/")
    treasury_page.fill("#id_account", str(alice.pk))
    treasury_page.select_option("#id_asset", label="BTC")
    treasury_page.fill("#id_amount", "0.75")
    treasury_page.fill("#id_reason", "ticket 318: deposit credited short")
    treasury_page.click('input[name="_save"]')
    treasury_page.wait_for_load_state()
    assert any("no money has moved" in m for m in messages(treasury_page)), messages(treasury_page)
    adjustment = ManualAdjustment.objects.get()
    assert adjustment.status == AdjustmentStatus.PROPOSED
    assert_balance(alice, "BTC", "0")

    # The proposer has no confirm button, and a crafted confirm is refused.
    assert treasury_page.locator("#confirm-adjustment").count() == 0
    screenshot(treasury_page, "treasury-adjustment-proposed")
    decide = f"{live_server.url}/admin/accounts/manualadjustment/{adjustment.pk}/decide/"
    post_as_page(treasury_page, decide, {"decision": "confirm", "reason": "my own"})
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.PROPOSED
    assert_balance(alice, "BTC", "0")

    admin_page.goto(f"{live_server.url}/admin/accounts/manualadjustment/{adjustment.pk}/change/")
    admin_page.fill("#id_decision_reason", "matches the chain record")
    admin_page.click("#confirm-adjustment")
    admin_page.wait_for_load_state()
    assert any("confirmed and posted" in m for m in messages(admin_page)), messages(admin_page)
    screenshot(admin_page, "administrator-adjustment-confirmed")
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.CONFIRMED
    assert (adjustment.created_by, adjustment.decided_by) == (treasurer, admin)
    assert_balance(alice, "BTC", "0.75")
    assert_ledger_balanced()
    assert btc.code == "BTC"


def test_administrator_creates_an_api_key_and_sees_the_secret_once(page, live_server):
    alice = usdt_customer("50")
    _login(page, live_server, ADMINISTRATOR)
    page.goto(f"{live_server.url}/admin/accounts/apikey/add/")
    page.fill("#id_user", str(alice.user.pk))
    page.fill("#id_name", "desk-2")
    page.fill("#id_reason", "customer request by signed letter")
    page.click('input[name="_save"]')
    page.wait_for_load_state()
    secret = page.inner_text("#secret-key").strip()
    key = page.inner_text("#api-key").strip()
    assert re.fullmatch(r"[A-Za-z0-9]{32,}", secret), secret
    screenshot(page, "administrator-api-key-created")
    api_key = ApiKey.objects.get(key=key)

    # Never again: not on any page of the key, nor in the list, history or audit trail.
    for path in (
        f"/admin/accounts/apikey/{api_key.pk}/change/",
        f"/admin/accounts/apikey/{api_key.pk}/history/",
        "/admin/accounts/apikey/",
        f"/admin/accounts/apikey/?q={key}",
        "/admin/exchange/staffaction/",
    ):
        page.goto(f"{live_server.url}{path}")
        assert secret not in page.content(), path

    # The key works with that secret, and it reads the balances the ledger holds.
    response = SignedClient(key, secret).get("/openapi/v1/account")
    assert response.status_code == 200, response.content[:300]
    usdt = next(b for b in response.json()["balances"] if b["asset"] == "USDT")
    assert usdt["free"].rstrip("0").rstrip(".") == "50"
    assert_balance(alice.user, "USDT", "50")
    assert_ledger_balanced()


def test_administrator_lifts_a_ban(page, live_server):
    ban = banned_ip("192.0.2.88")
    from_there = Client(REMOTE_ADDR=ban.ip)
    assert from_there.get(PING).status_code == 418  # banned
    admin = _login(page, live_server, ADMINISTRATOR)
    run_action(page, live_server.url, BANS, "lift_bans", [ban.pk], reason="customer fixed their retry loop")
    assert any("Lifted 1 ban(s)." in m for m in messages(page)), messages(page)
    screenshot(page, "administrator-ban-lifted")
    ban.refresh_from_db()
    assert ban.lifted_at is not None
    assert ban.lifted_by == admin
    assert not RateLimitBan.objects.filter(ip=ban.ip, lifted_at__isnull=True).exists()
    assert StaffAction.objects.get(action="ban.lift").reason == "customer fixed their retry loop"
    assert from_there.get(PING).status_code == 200  # the address is served again
    assert_ledger_balanced()
