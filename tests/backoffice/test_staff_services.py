"""Every rule about money in its service (issue 36, item 3): approving or rejecting a withdrawal,
proposing, confirming or cancelling a manual adjustment and approving a four-eyes change each check
the acting staff member's permission and write the audit row inside the service, whoever calls it.
These tests call the services directly, as a management command or a future API would: a staff
member without the permission is refused (a PermissionDenied), nothing moves and nothing is
recorded; one with it leaves the audit row without any admin code running. And the approval
settings are checked at start-up (wallet/approvals.py, check_thresholds)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from accounts.ledger import services as ledger_services
from accounts.ledger.models import AdjustmentStatus, ManualAdjustment, Posting
from exchange.backoffice import changes
from exchange.backoffice.models import ChangeRequest, ChangeStatus, StaffAction
from exchange.backoffice.services import StaffNotPermitted
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.backoffice import awaiting_withdrawal, usdt_customer
from tests.support.factories import AssetFactory, NetworkFactory, UserFactory
from tests.support.staff import ADMINISTRATOR, SUPPORT, TREASURY, staff_member
from wallet import approvals
from wallet.models import Withdrawal, WithdrawalStage

pytestmark = pytest.mark.django_db


def _unprivileged():
    """A Support member (read-only), a customer and a deactivated Treasury member."""
    retired = staff_member(TREASURY)
    retired.is_active = False
    retired.save(update_fields=["is_active"])
    return [staff_member(SUPPORT), UserFactory(), retired]


# --- withdrawals -----------------------------------------------------------------------------------


def test_approving_or_rejecting_a_withdrawal_without_the_permission_is_refused_and_nothing_moves(
    django_capture_on_commit_callbacks,
):
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    for someone in _unprivileged():
        with django_capture_on_commit_callbacks(execute=True) as handed:
            with pytest.raises(PermissionDenied, match="may not approve withdrawals"):
                approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=someone, reason="looks fine")
            with pytest.raises(StaffNotPermitted, match="may not reject withdrawals"):
                approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=someone, reason="looks wrong")
        assert handed == []  # nothing handed to a worker
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert (withdrawal.first_approved_by, withdrawal.decided_by) == (None, None)
    assert_balance(alice.user, "USDT", "89", "11")  # still held: neither sent nor released
    assert not StaffAction.objects.exists()
    assert_ledger_balanced()


def test_the_approval_service_writes_its_own_audit_row(django_capture_on_commit_callbacks):
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    treasurer = staff_member(TREASURY)
    with django_capture_on_commit_callbacks(execute=True):
        approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=treasurer, reason="ticket 12")
    record = StaffAction.objects.get()
    assert (record.actor, record.action, record.reason) == (treasurer, "withdrawal.approve", "ticket 12")
    assert record.object_id == str(withdrawal.pk)
    assert record.before["stage"] == WithdrawalStage.AWAITING_APPROVAL
    assert record.after["stage"] == WithdrawalStage.QUEUED
    assert Withdrawal.objects.get(pk=withdrawal.pk).stage == WithdrawalStage.SUCCEEDED

    # A decided withdrawal is left alone: no second row.
    approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=staff_member(TREASURY), reason="again")
    approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=treasurer, reason="too late")
    assert StaffAction.objects.count() == 1
    assert_ledger_balanced()


def test_the_rejection_service_writes_its_own_audit_row_and_releases_the_funds():
    alice = usdt_customer("100")
    withdrawal = awaiting_withdrawal(alice.user, "10")
    treasurer = staff_member(TREASURY)
    rejected = approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=treasurer, reason="mule account")
    assert (rejected.stage, rejected.info, rejected.decided_by) == (WithdrawalStage.FAILED, "mule account", treasurer)
    record = StaffAction.objects.get()
    assert (record.actor, record.action, record.reason) == (treasurer, "withdrawal.reject", "mule account")
    assert record.after["stage"] == WithdrawalStage.FAILED
    assert_balance(alice.user, "USDT", "100")
    assert_ledger_balanced()


# --- manual adjustments ----------------------------------------------------------------------------


def _proposal(amount: str = "1"):
    alice, treasurer = UserFactory(), staff_member(TREASURY)
    adjustment = ledger_services.adjustment_propose(
        account=alice, asset=AssetFactory(code="BTC"), amount=Decimal(amount), reason="r", proposed_by=treasurer
    )
    return alice, treasurer, adjustment


def test_proposing_an_adjustment_without_the_permission_is_refused():
    alice, btc = UserFactory(), AssetFactory(code="BTC")
    for someone in _unprivileged():
        with pytest.raises(StaffNotPermitted, match="may not propose adjustments"):
            ledger_services.adjustment_propose(
                account=alice, asset=btc, amount=Decimal(1), reason="gift", proposed_by=someone
            )
    assert not ManualAdjustment.objects.exists()
    assert not StaffAction.objects.exists()


def test_confirming_or_cancelling_an_adjustment_without_the_permission_is_refused_and_nothing_moves():
    alice, _proposer, adjustment = _proposal()
    postings = Posting.objects.count()
    records = StaffAction.objects.count()  # the proposal's
    # Treasury proposes but does not confirm; a Treasury member who did not propose may not cancel.
    for someone in [*_unprivileged(), staff_member(TREASURY)]:
        with pytest.raises(StaffNotPermitted):
            ledger_services.adjustment_confirm(adjustment_id=adjustment.pk, confirmed_by=someone, reason="ok")
        with pytest.raises(PermissionDenied, match="Only the proposer or an Administrator"):
            ledger_services.adjustment_cancel(adjustment_id=adjustment.pk, cancelled_by=someone, reason="no")
    adjustment.refresh_from_db()
    assert adjustment.status == AdjustmentStatus.PROPOSED
    assert Posting.objects.count() == postings
    assert StaffAction.objects.count() == records
    assert_balance(alice, "BTC", "0")


def test_the_adjustment_services_write_their_own_audit_rows():
    alice, treasurer, adjustment = _proposal("2")
    admin = staff_member(ADMINISTRATOR)
    ledger_services.adjustment_confirm(adjustment_id=adjustment.pk, confirmed_by=admin, reason="ticket 9")
    propose, confirm = StaffAction.objects.order_by("id")
    assert (propose.actor, propose.action, propose.object_id) == (treasurer, "adjustment.propose", str(adjustment.pk))
    assert (confirm.actor, confirm.action, confirm.reason) == (admin, "adjustment.confirm", "ticket 9")
    assert (confirm.before["status"], confirm.after["status"]) == ("PROPOSED", "CONFIRMED")
    assert_balance(alice, "BTC", "2")

    _alice, proposer, other = _proposal()
    ledger_services.adjustment_cancel(adjustment_id=other.pk, cancelled_by=proposer, reason="typo")
    cancel = StaffAction.objects.order_by("id").last()
    assert (cancel.actor, cancel.action, cancel.after["status"]) == (proposer, "adjustment.cancel", "CANCELLED")
    assert_ledger_balanced()


# --- four-eyes changes -----------------------------------------------------------------------------


def test_approving_a_change_without_the_permission_is_refused_and_nothing_changes():
    btc = NetworkFactory(coin__code="BTC", network="BTC").coin
    proposed = changes.change_submit(
        actor=staff_member(ADMINISTRATOR), obj=btc, changes={"reference_price": "100"}, reason="feed"
    )
    assert proposed.request is not None
    records = StaffAction.objects.count()
    for someone in [*_unprivileged(), staff_member(TREASURY)]:
        with pytest.raises(PermissionDenied):
            changes.change_approve(request_id=proposed.request.pk, approved_by=someone, reason="fine")
        with pytest.raises(changes.ChangeNotPermitted):
            changes.change_cancel(request_id=proposed.request.pk, cancelled_by=someone, reason="no")
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5000000")
    assert ChangeRequest.objects.get().status == ChangeStatus.PROPOSED
    assert StaffAction.objects.count() == records


# --- the approval settings, checked at start-up ------------------------------------------------------


def test_a_four_eyes_value_below_the_approval_threshold_stops_the_process(settings):
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1000000")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal("500000")
    with pytest.raises(SystemCheckError, match=r"wallet\.E002"):
        call_command("check")
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("-1")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = None  # four eyes off: only the threshold's own check
    with pytest.raises(SystemCheckError, match=r"wallet\.E001"):
        call_command("check")


@pytest.mark.parametrize(("approval", "four_eyes"), [("1000000", "5000000"), ("1000000", "1000000"), ("0", None)])
def test_consistent_approval_settings_pass_the_check(settings, approval, four_eyes):
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal(approval)
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal(four_eyes) if four_eyes else None
    assert approvals.check_thresholds() == []
    call_command("check")  # raises SystemCheckError on any error
