"""Issue 25, findings 2 and 3 as staff meet them: Debian's Chromium, driven by Playwright, against the
live server (tests/backoffice/test_browser_roles.py starts it the same way).

- An Administrator lowering a reference price only proposes it; the proposer has no approve button
  (and a crafted approval is refused); a second Administrator approves it on its page.
- An Administrator cannot move a funded account under another master (refused, nothing changes);
  an empty account's move waits for a second Administrator.
- A key an Administrator makes on a customer's account is Read only: its secret cannot move the
  customer's money (-1020), and widening its types on its page is refused.
Screenshots go to var/artifacts/ (not committed)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.ledger.models import Asset
from accounts.models import ApiKey
from exchange.backoffice.models import ChangeRequest, ChangeStatus, StaffAction
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.browser import login, messages, new_page, post_as_page, screenshot
from tests.support.client import SignedClient
from tests.support.factories import TEST_PASSWORD, NetworkFactory, customer
from tests.support.staff import ADMINISTRATOR, staff_member
from wallet.models import Transfer

pytestmark = pytest.mark.django_db(transaction=True)


def _administrator(browser, live_server):
    member = staff_member(ADMINISTRATOR)
    page = new_page(browser)
    login(page, live_server.url, member.email, TEST_PASSWORD)
    return member, page


def _save(page) -> None:
    page.click('input[name="_save"]')
    page.wait_for_load_state()


def test_lowering_a_reference_price_waits_for_a_second_administrator(browser, live_server):
    btc = NetworkFactory(coin__code="BTC", network="BTC").coin
    admin1, page1 = _administrator(browser, live_server)
    admin2, page2 = _administrator(browser, live_server)

    page1.goto(f"{live_server.url}/admin/accounts/asset/{btc.pk}/change/")
    page1.fill("#id_reference_price", "0")
    page1.fill("#id_reason", "price feed says 0")
    _save(page1)
    assert any("nothing has changed yet" in m for m in messages(page1)), messages(page1)
    assert page1.locator("#proposed-changes").count() == 1
    assert page1.locator("#approve-change").count() == 0  # not the proposer's to approve
    screenshot(page1, "administrator-price-lowering-proposed")
    assert Asset.objects.get(pk=btc.pk).reference_price == Decimal("5000000")
    proposal = ChangeRequest.objects.get()

    crafted = f"{live_server.url}/admin/exchange/changerequest/{proposal.pk}/decide/"
    post_as_page(page1, crafted, {"decision": "approve", "reason": "my own"})
    assert Asset.objects.get(pk=btc.pk).reference_price == Decimal("5000000")
    assert ChangeRequest.objects.get().status == ChangeStatus.PROPOSED

    page2.goto(f"{live_server.url}/admin/exchange/changerequest/{proposal.pk}/change/")
    page2.fill("#id_decision_reason", "feed outage confirmed with the desk")
    page2.click("#approve-change")
    page2.wait_for_load_state()
    assert any("approved and applied" in m for m in messages(page2)), messages(page2)
    screenshot(page2, "administrator-price-lowering-approved")
    assert Asset.objects.get(pk=btc.pk).reference_price == Decimal(0)
    actions = list(StaffAction.objects.order_by("id").values_list("action", "actor"))
    assert actions == [("asset.propose", admin1.pk), ("asset.approve", admin2.pk)]


def test_an_administrator_cannot_move_a_funded_account_under_another_master(browser, live_server):
    peer = customer(email="peer@test.example", funding={"PHP": "4000"})
    other = customer(email="other-master@test.example")
    _, page = _administrator(browser, live_server)

    page.goto(f"{live_server.url}/admin/accounts/user/{peer.user.pk}/change/")
    page.fill("#id_master", str(other.user.pk))
    page.fill("#id_reason", "merge at the customer's request")
    _save(page)
    assert any("still holds 4000 PHP" in m for m in messages(page)), messages(page)
    screenshot(page, "administrator-reparent-refused")
    peer.user.refresh_from_db()
    assert peer.user.master_id is None
    assert not ChangeRequest.objects.exists()
    assert_balance(peer.user, "PHP", "4000")
    assert_ledger_balanced()


def test_moving_an_empty_account_waits_for_a_second_administrator(browser, live_server):
    peer = customer(email="peer@test.example")
    other = customer(email="other-master@test.example")
    _, page1 = _administrator(browser, live_server)
    admin2, page2 = _administrator(browser, live_server)

    page1.goto(f"{live_server.url}/admin/accounts/user/{peer.user.pk}/change/")
    page1.fill("#id_master", str(other.user.pk))
    page1.fill("#id_reason", "customer's signed letter")
    _save(page1)
    assert any("another Administrator must approve it" in m for m in messages(page1)), messages(page1)
    assert page1.locator("#approve-change").count() == 0
    peer.user.refresh_from_db()
    assert peer.user.master_id is None
    proposal = ChangeRequest.objects.get()

    page2.goto(f"{live_server.url}/admin/exchange/changerequest/{proposal.pk}/change/")
    page2.fill("#id_decision_reason", "letter verified by phone")
    page2.click("#approve-change")
    page2.wait_for_load_state()
    assert any("approved and applied" in m for m in messages(page2)), messages(page2)
    screenshot(page2, "administrator-reparent-approved")
    peer.user.refresh_from_db()
    assert peer.user.master_id == other.user.pk
    assert ChangeRequest.objects.get().decided_by == admin2


def test_a_key_made_by_an_administrator_cannot_move_the_customers_money(browser, live_server):
    peer = customer(email="peer@test.example", funding={"PHP": "1000"})
    thief = customer(email="thief@test.example")
    _, page = _administrator(browser, live_server)

    page.goto(f"{live_server.url}/admin/accounts/apikey/add/")
    # The types are not the Administrator's to choose: Read only, ticked and disabled.
    assert page.locator('input[name="types"][value="Read only"]').is_checked()
    assert page.locator('input[name="types"][value="Enable Fiat"]').is_disabled()
    page.fill("#id_user", str(peer.user.pk))
    page.fill("#id_name", "desk")
    page.fill("#id_reason", "customer asked by phone")
    _save(page)
    key = page.inner_text("#api-key").strip()
    secret = page.inner_text("#secret-key").strip()
    screenshot(page, "administrator-key-read-only")
    api_key = ApiKey.objects.get(key=key)
    assert api_key.types == ["Read only"]

    moved = SignedClient(key, secret).post(
        "/openapi/transfer/v4/transfers", {"account": "PHP", "target_address": thief.user.email, "amount": "100"}
    )
    assert_error(moved, -1020, 401, msg_contains="read-only API key")
    assert not Transfer.objects.exists()

    # Widening it on its page is refused with the rule.
    page.goto(f"{live_server.url}/admin/accounts/apikey/{api_key.pk}/change/")
    page.check('input[name="types"][value="Enable Fiat"]')
    page.uncheck('input[name="types"][value="Read only"]')
    page.fill("#id_reason", "customer wants to send PHP")
    _save(page)
    assert "Staff may only narrow a key's types" in page.inner_text("body")
    screenshot(page, "administrator-key-widening-refused")
    api_key.refresh_from_db()
    assert api_key.types == ["Read only"]
    assert_balance(peer.user, "PHP", "1000")
    assert_ledger_balanced()
