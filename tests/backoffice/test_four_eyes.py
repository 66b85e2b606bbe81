"""Four eyes: a manual adjustment is proposed (no money moves) and posted only when a second staff
member confirms it, once, however many confirm at the same time; its proposer cannot confirm. A
withdrawal approval above WITHDRAWAL_FOUR_EYES_ABOVE takes two approvers, the second not the first,
and so does one whose customer's withdrawals of the last 24 hours add up to more than that."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.urls import reverse

from accounts.ledger import services as ledger_services
from accounts.ledger.models import AdjustmentStatus, ManualAdjustment, Posting
from exchange.backoffice.models import StaffAction
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.backoffice import awaiting_withdrawal, usdt_customer
from tests.support.factories import AssetFactory, UserFactory, WhitelistAddressFactory, fund, sub_account
from tests.support.staff import ADMINISTRATOR, SUPPORT, TREASURY, logged_in, staff_member
from wallet import approvals as wallet_approvals
from wallet.models import Network, Withdrawal, WithdrawalStage

ADD = reverse("admin:accounts_manualadjustment_add")


def _decide_url(adjustment: ManualAdjustment) -> str:
    return reverse("admin:accounts_manualadjustment_decide", args=[adjustment.pk])


def _propose(client, account, amount: str, reason: str = "ticket 7: missed deposit"):
    btc = AssetFactory(code="BTC")
    data = {"account": account.pk, "asset": btc.pk, "amount": amount, "reason": reason, "_save": "Save"}
    return client.post(ADD, data)


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- adjustments through the admin ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_proposal_moves_nothing_the_proposer_cannot_confirm_another_administrator_does():
    alice = UserFactory()
    treasurer, admin = staff_member(TREASURY), staff_member(ADMINISTRATOR)
    postings_before = Posting.objects.count()

    response = _propose(logged_in(treasurer), alice, "0.5")
    assert response.status_code == 302, response.content[:500]
    adjustment = ManualAdjustment.objects.get()
    assert adjustment.status == AdjustmentStatus.PROPOSED
    assert adjustment.posting_id is None
    assert Posting.objects.count() == postings_before  # no money moved
    assert_balance(alice, "BTC", "0")

    # The proposer's page has no confirm button and their confirm is refused.
    page = logged_in(treasurer).get(reverse("admin:accounts_manualadjustment_change", args=[adjustment.pk]))
    assert b'id="confirm-adjustment"' not in page.content
    refused = logged_in(treasurer).post(_decide_url(adjustment), {"decision": "confirm", "reason": "me"}, follow=True)
    assert any("you proposed this adjustment" in m for m in _messages(refused)), _messages(refused)
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.PROPOSED
    assert_balance(alice, "BTC", "0")

    # Another Treasury member may not confirm either: confirming is the Administrator's.
    other_treasurer = logged_in(staff_member(TREASURY))
    assert other_treasurer.post(_decide_url(adjustment), {"decision": "confirm", "reason": "x"}).status_code == 403

    # A confirmation without a reason is refused.
    admin_client = logged_in(admin)
    no_reason = admin_client.post(_decide_url(adjustment), {"decision": "confirm", "reason": " "}, follow=True)
    assert any("reason is required" in m for m in _messages(no_reason))
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.PROPOSED

    page = admin_client.get(reverse("admin:accounts_manualadjustment_change", args=[adjustment.pk]))
    assert b'id="confirm-adjustment"' in page.content
    done = admin_client.post(_decide_url(adjustment), {"decision": "confirm", "reason": "ticket checked"}, follow=True)
    assert any("confirmed and posted" in m for m in _messages(done)), _messages(done)
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.CONFIRMED
    assert (adjustment.created_by, adjustment.decided_by) == (treasurer, admin)
    assert adjustment.posting.actor_id == admin.pk
    assert_balance(alice, "BTC", "0.5")
    assert_ledger_balanced()

    # Audited: who, what, why, before and after, for both steps.
    propose, confirm = StaffAction.objects.order_by("id")
    assert (propose.actor, propose.action) == (treasurer, "adjustment.propose")
    assert propose.reason == "ticket 7: missed deposit"
    assert (confirm.actor, confirm.action, confirm.reason) == (admin, "adjustment.confirm", "ticket checked")
    assert confirm.object_id == str(adjustment.pk)
    assert confirm.before["status"] == "PROPOSED"
    assert confirm.after["status"] == "CONFIRMED"
    assert confirm.after["posting"] == adjustment.posting_id

    # Confirming again changes nothing.
    again = admin_client.post(_decide_url(adjustment), {"decision": "confirm", "reason": "again"}, follow=True)
    assert any("already confirmed" in m for m in _messages(again)), _messages(again)
    assert_balance(alice, "BTC", "0.5")


@pytest.mark.django_db
def test_support_cannot_propose_or_decide():
    alice = UserFactory()
    adjustment = ledger_services.adjustment_propose(
        account=alice, asset=AssetFactory(code="BTC"), amount=Decimal(1), reason="r", proposed_by=staff_member(TREASURY)
    )
    support = logged_in(staff_member(SUPPORT))
    assert _propose(support, alice, "1").status_code == 403
    for decision in ("confirm", "cancel"):
        assert support.post(_decide_url(adjustment), {"decision": decision, "reason": "x"}).status_code == 403
    page = support.get(reverse("admin:accounts_manualadjustment_change", args=[adjustment.pk]))
    assert page.status_code == 200
    assert b"decide-form" not in page.content
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.PROPOSED


@pytest.mark.django_db
def test_the_proposer_may_cancel_a_proposal_and_nothing_is_posted():
    alice, treasurer = UserFactory(), staff_member(TREASURY)
    _propose(logged_in(treasurer), alice, "2")
    adjustment = ManualAdjustment.objects.get()
    response = logged_in(treasurer).post(_decide_url(adjustment), {"decision": "cancel", "reason": "typo"})
    assert response.status_code == 302
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.CANCELLED
    assert adjustment.posting_id is None
    with pytest.raises(ledger_services.AdjustmentRefused):
        ledger_services.adjustment_confirm(
            adjustment_id=adjustment.pk, confirmed_by=staff_member(ADMINISTRATOR), reason="go"
        )
    assert_balance(alice, "BTC", "0")


# --- adjustments: the service and the database ---------------------------------------------------


@pytest.mark.django_db
def test_the_service_refuses_the_proposer_and_the_database_refuses_it_too():
    alice, admin = UserFactory(), staff_member(ADMINISTRATOR)
    adjustment = ledger_services.adjustment_propose(
        account=alice, asset=AssetFactory(code="BTC"), amount=Decimal(1), reason="r", proposed_by=admin
    )
    with pytest.raises(ledger_services.AdjustmentRefused, match="proposer cannot confirm"):
        ledger_services.adjustment_confirm(adjustment_id=adjustment.pk, confirmed_by=admin, reason="go")
    # A hand-made write that skips the service cannot record the proposer as the confirmer either.
    posting = Posting.objects.first()
    with pytest.raises(IntegrityError), transaction.atomic():
        ManualAdjustment.objects.filter(pk=adjustment.pk).update(
            status=AdjustmentStatus.CONFIRMED, decided_by=admin, posting=posting
        )
    assert_balance(alice, "BTC", "0")


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_confirmations_post_once():
    """Two Administrators press Confirm at the same moment, each on their own connection: the row
    lock queues them, one posts, the other finds it confirmed; the money moves once."""
    alice = UserFactory()
    adjustment = ledger_services.adjustment_propose(
        account=alice,
        asset=AssetFactory(code="BTC"),
        amount=Decimal("1.25"),
        reason="r",
        proposed_by=staff_member(TREASURY),
    )
    confirmers = [staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)]
    barrier = threading.Barrier(len(confirmers))
    outcomes: list[str] = []

    def confirm(user) -> None:
        try:
            barrier.wait(timeout=10)
            ledger_services.adjustment_confirm(adjustment_id=adjustment.pk, confirmed_by=user, reason="go")
            outcomes.append("posted")
        except ledger_services.AdjustmentRefused:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=confirm, args=(user,)) for user in confirmers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["posted", "refused"]
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.CONFIRMED
    assert Posting.objects.filter(reference=f"adjustment:{adjustment.pk}").count() == 1
    assert_balance(alice, "BTC", "1.25")
    assert_ledger_balanced()


# --- withdrawals above the four-eyes value -------------------------------------------------------


def _approve(client, withdrawal, reason="checked the address"):
    return client.post(
        reverse("admin:wallet_withdrawal_changelist"),
        {"action": "approve", "_selected_action": [str(withdrawal.pk)], "index": "0", "reason": reason},
        follow=True,
    )


@pytest.mark.django_db
def test_a_large_withdrawal_needs_a_second_approver_not_the_first(settings, django_capture_on_commit_callbacks):
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal("100")  # PHP; 10 USDT + 1 fee is more
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    first, second = staff_member(TREASURY), staff_member(TREASURY)

    response = _approve(logged_in(first), withdrawal)
    assert any("wait for a second approver" in m for m in _messages(response)), _messages(response)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert withdrawal.first_approved_by == first

    again = _approve(logged_in(first), withdrawal)
    assert any("needs a second approver" in m for m in _messages(again)), _messages(again)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    with pytest.raises(wallet_approvals.ApprovalRefused):
        wallet_approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=first, reason="again")

    with django_capture_on_commit_callbacks(execute=True):
        _approve(logged_in(second), withdrawal)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED  # sent and settled on the simulated chain
    assert (withdrawal.first_approved_by, withdrawal.decided_by) == (first, second)
    assert_balance(alice.user, "USDT", "89")  # 10 sent + 1 fee
    assert_ledger_balanced()
    approvals = StaffAction.objects.filter(action="withdrawal.approve").order_by("id")
    actions = list(approvals.values_list("actor", flat=True))
    assert actions == [first.pk, second.pk]  # the refused attempt left no record


@pytest.mark.django_db
def test_a_withdrawal_below_the_four_eyes_value_needs_one_approver(settings, django_capture_on_commit_callbacks):
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal("1000000")
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    with django_capture_on_commit_callbacks(execute=True):
        _approve(logged_in(staff_member(TREASURY)), withdrawal)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert withdrawal.first_approved_by is None
    assert_balance(alice.user, "USDT", "89")
    assert_ledger_balanced()


# --- a large withdrawal split into pieces (issue 34) ---------------------------------------------


def _piece_value(withdrawal) -> Decimal:
    return withdrawal.approval_value  # amount plus fee in PHP when applied, as the thresholds measure


@pytest.mark.django_db
def test_pieces_that_together_pass_the_four_eyes_value_in_a_day_need_a_second_approver(
    settings, django_capture_on_commit_callbacks
):
    """Each piece alone is below WITHDRAWAL_FOUR_EYES_ABOVE (one approver by design); once the
    customer's withdrawals of the last 24 hours, the one being approved included, add up to more,
    the approval takes two people, the second not the first."""
    alice = usdt_customer("100")
    first_piece = awaiting_withdrawal(alice.user, "10")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = _piece_value(first_piece) * Decimal("1.5")  # one piece: below
    approver, other = staff_member(TREASURY), staff_member(TREASURY)

    with django_capture_on_commit_callbacks(execute=True):
        _approve(logged_in(approver), first_piece)
    first_piece.refresh_from_db()
    assert first_piece.stage == WithdrawalStage.SUCCEEDED  # alone below the value: one approver
    assert first_piece.first_approved_by is None

    second_piece = awaiting_withdrawal(alice.user, "10")
    assert not second_piece.needs_two_approvals  # below the value alone, as applied
    response = _approve(logged_in(approver), second_piece)
    assert any("wait for a second approver" in m for m in _messages(response)), _messages(response)
    second_piece.refresh_from_db()
    assert second_piece.stage == WithdrawalStage.AWAITING_APPROVAL
    assert (second_piece.first_approved_by, second_piece.needs_two_approvals) == (approver, True)
    again = _approve(logged_in(approver), second_piece)
    assert any("needs a second approver" in m for m in _messages(again)), _messages(again)

    with django_capture_on_commit_callbacks(execute=True):
        _approve(logged_in(other), second_piece)
    second_piece.refresh_from_db()
    assert second_piece.stage == WithdrawalStage.SUCCEEDED
    assert (second_piece.first_approved_by, second_piece.decided_by) == (approver, other)
    assert_balance(alice.user, "USDT", "78")  # two pieces of 10 + 1 fee
    assert_ledger_balanced()


@pytest.mark.django_db
def test_the_days_sum_counts_the_family_and_not_old_or_rejected_withdrawals(
    settings, django_capture_on_commit_callbacks
):
    alice = usdt_customer("100")
    old = awaiting_withdrawal(alice.user, "10")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = _piece_value(old) * Decimal("1.5")
    Withdrawal.objects.filter(pk=old.pk).update(applied_at=old.applied_at - timedelta(hours=25))
    rejected = awaiting_withdrawal(alice.user, "10")
    wallet_approvals.withdrawal_reject(withdrawal=rejected, rejected_by=staff_member(TREASURY), reason="no")
    piece = awaiting_withdrawal(alice.user, "10")
    assert wallet_approvals.recent_withdrawals_value(piece) == _piece_value(piece)  # only itself
    assert wallet_approvals.needs_two_approvals(piece) is False

    # A piece withdrawn from a sub-account of the same customer counts.
    sub = sub_account(alice.user)
    WhitelistAddressFactory(account=sub, network=Network.objects.get(coin__code="USDT", network="TRX"))
    fund(sub, "USDT", "50")
    from_sub = awaiting_withdrawal(sub, "10")
    assert wallet_approvals.recent_withdrawals_value(piece) == _piece_value(piece) + _piece_value(from_sub)
    assert wallet_approvals.needs_two_approvals(piece) is True
    assert wallet_approvals.needs_two_approvals(from_sub) is True
