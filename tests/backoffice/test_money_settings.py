"""Issue 25, finding 2: one Administrator could approve a large withdrawal alone, by setting the
asset's reference price to 0 in the admin, approving, and restoring the price.

Now a withdrawal's four-eyes decision is taken when it is applied (its value recorded on the row)
and never lowered; no price at approval time fails closed; and a change of a setting that matters
to money goes through exchange/backoffice/changes.py: a reason, an audit record, and a second Administrator
for a change that loosens a control (a price lowered, a fee or minimum lowered, a limit raised)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from accounts.ledger.models import Asset
from accounts.models import LimitTier, TierLimit
from exchange.backoffice import changes
from exchange.backoffice.models import ChangeRequest, ChangeStatus, StaffAction
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.backoffice import whitelisted_withdrawal
from tests.support.factories import NetworkFactory, WhitelistAddressFactory, customer
from tests.support.staff import ADMINISTRATOR, TREASURY, logged_in, staff_member
from wallet import approvals as wallet_approvals
from wallet import deposits as wallet_deposits
from wallet.models import Network, TransferFee, Withdrawal, WithdrawalStage

pytestmark = pytest.mark.django_db

WITHDRAWALS = reverse("admin:wallet_withdrawal_changelist")


@pytest.fixture(autouse=True)
def _no_daily_limits(db):
    """Large withdrawals without the default tier's limits in the way (the limits are not tested here)."""
    TierLimit.objects.all().delete()


def _btc_customer(btc: str = "3"):
    made = customer(funding={"BTC": btc})
    WhitelistAddressFactory(account=made.user, network=NetworkFactory(coin__code="BTC", network="BTC"))
    return made


def _btc_withdrawal(user, amount: str) -> Withdrawal:
    return whitelisted_withdrawal(user, "BTC", "BTC", amount)


def _approve(client, withdrawal, reason="address checked"):
    return client.post(
        WITHDRAWALS,
        {"action": "approve", "_selected_action": [str(withdrawal.pk)], "index": "0", "reason": reason},
        follow=True,
    )


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def _asset_form(asset: Asset, **changed) -> dict:
    return {
        "name": asset.name,
        "transfer_precision": str(asset.transfer_precision),
        "transfer_min_quantity": str(asset.transfer_min_quantity),
        "reference_price": str(asset.reference_price),
        **({"is_fiat": "on"} if asset.is_fiat else {}),
        "_save": "Save",
        **changed,
    }


def _asset_change(client, asset: Asset, **changed):
    return client.post(reverse("admin:accounts_asset_change", args=[asset.pk]), _asset_form(asset, **changed))


def _decide(client, request_id: int, decision: str, reason: str = "second look"):
    return client.post(
        reverse("admin:exchange_changerequest_decide", args=[request_id]),
        {"decision": decision, "reason": reason},
        follow=True,
    )


# --- the withdrawal's decision is recorded and never lowered ---------------------------------------


def test_the_reproduction_a_price_set_to_0_after_applying_does_not_let_one_administrator_send_it(
    settings, django_capture_on_commit_callbacks
):
    """The finding's steps: a 2 BTC (~10M PHP) withdrawal waits; admin1 sets BTC's price to 0
    (here straight in the table, as any path that did change it would), approves alone, restores
    the price. It must still wait for a second approver."""
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1000000")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal("5000000")
    alice = _btc_customer("3")
    withdrawal = _btc_withdrawal(alice.user, "2")
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert withdrawal.needs_two_approvals is True
    assert withdrawal.approval_value == Decimal("2") * Decimal("5000000") + withdrawal.fee * Decimal("5000000")

    admin1 = staff_member(ADMINISTRATOR)
    Asset.objects.filter(code="BTC").update(reference_price=Decimal(0))
    with django_capture_on_commit_callbacks(execute=True):
        response = _approve(logged_in(admin1), withdrawal)
    assert any("wait for a second approver" in m for m in _messages(response)), _messages(response)
    Asset.objects.filter(code="BTC").update(reference_price=Decimal("5000000"))
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert withdrawal.first_approved_by == admin1
    assert withdrawal.decided_by is None
    assert_balance(alice.user, "BTC", str(Decimal(3) - 2 - withdrawal.fee), locked=str(2 + withdrawal.fee))

    # A second Administrator sends it.
    with django_capture_on_commit_callbacks(execute=True):
        _approve(logged_in(staff_member(ADMINISTRATOR)), withdrawal)
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    assert_ledger_balanced()


def test_a_price_gone_to_0_at_approval_time_needs_two_approvers(settings, django_capture_on_commit_callbacks):
    """Below the four-eyes value when applied, but the asset has no price when approved: fail closed."""
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal("5000000")
    alice = _btc_customer("3")
    withdrawal = _btc_withdrawal(alice.user, "0.1")  # 500,000 PHP: one approver when applied
    assert (withdrawal.stage, withdrawal.needs_two_approvals) == (WithdrawalStage.AWAITING_APPROVAL, False)
    Asset.objects.filter(code="BTC").update(reference_price=Decimal(0))
    with django_capture_on_commit_callbacks(execute=True):
        wallet_approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=staff_member(TREASURY), reason="checked")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    assert withdrawal.first_approved_by is not None


def test_a_price_raised_after_applying_raises_the_decision(settings, django_capture_on_commit_callbacks):
    """Re-evaluated upwards only: worth more than the four-eyes value at today's price, two approvers."""
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1")
    settings.WITHDRAWAL_FOUR_EYES_ABOVE = Decimal("5000000")
    alice = _btc_customer("3")
    withdrawal = _btc_withdrawal(alice.user, "0.5")  # 2.5M PHP
    assert withdrawal.needs_two_approvals is False
    Asset.objects.filter(code="BTC").update(reference_price=Decimal("20000000"))  # now 10M PHP
    with django_capture_on_commit_callbacks(execute=True):
        wallet_approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=staff_member(TREASURY), reason="checked")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL


def test_a_withdrawal_without_a_recorded_value_needs_two_approvers(settings, django_capture_on_commit_callbacks):
    """A row of an earlier version that the migration did not value: fail closed."""
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("1")
    alice = _btc_customer("3")
    withdrawal = _btc_withdrawal(alice.user, "0.01")
    Withdrawal.objects.filter(pk=withdrawal.pk).update(approval_value=None, needs_two_approvals=False)
    withdrawal.refresh_from_db()
    assert wallet_approvals.needs_two_approvals(withdrawal) is True


def test_a_deposit_of_an_asset_without_a_price_waits_for_travel_rule_data(settings):
    from tests.support.backoffice import usdt_customer
    from wallet.models import DepositStatus

    settings.TRAVEL_RULE_THRESHOLD = Decimal("50000")
    alice = usdt_customer("0")
    Asset.objects.filter(code="USDT").update(reference_price=Decimal(0))
    address = wallet_deposits.deposit_address_get(account=alice.user, coin="USDT", network="TRX")
    deposit = wallet_deposits.deposit_record(
        network=address.network,
        tx_id="ab" * 32,
        output_index=0,
        address=address.address,
        tag=address.tag,
        amount=Decimal("1"),
        confirmations=100,
    )
    assert deposit.status == DepositStatus.NEED_FILL_DATA
    assert_balance(alice.user, "USDT", "0")


# --- a reference price changes only through the audited service -------------------------------------


def test_lowering_a_reference_price_waits_for_a_second_administrator():
    btc = Asset.objects.get(code="BTC") if Asset.objects.filter(code="BTC").exists() else None
    btc = btc or NetworkFactory(coin__code="BTC", network="BTC").coin
    admin1, admin2 = staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)
    client1 = logged_in(admin1)

    # No reason: refused by the form, nothing changes.
    no_reason = _asset_change(client1, btc, reference_price="0")
    assert no_reason.status_code == 200
    assert b"This field is required" in no_reason.content
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5000000")

    proposed = _asset_change(client1, btc, reference_price="0", reason="exchange feed broken")
    assert proposed.status_code == 302, proposed.content[:500]
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5000000")  # nothing changed yet
    request = ChangeRequest.objects.get()
    assert (request.status, request.proposed_by, request.loosens) == (
        ChangeStatus.PROPOSED,
        admin1,
        ["reference_price"],
    )
    assert request.changes == {"reference_price": "0"}
    assert request.before == {"reference_price": "5000000"}
    assert proposed["Location"] == reverse("admin:exchange_changerequest_change", args=[request.pk])
    record = StaffAction.objects.get(action="asset.propose")
    assert (record.actor, record.reason, record.object_id) == (admin1, "exchange feed broken", str(btc.pk))

    # The proposer has no approve button, and their approval is refused.
    page = client1.get(reverse("admin:exchange_changerequest_change", args=[request.pk]))
    assert b'id="approve-change"' not in page.content
    refused = _decide(client1, request.pk, "approve")
    assert any("another Administrator must approve it" in m for m in _messages(refused)), _messages(refused)
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5000000")
    with pytest.raises(changes.ChangeRefused):
        changes.change_approve(request_id=request.pk, approved_by=admin1, reason="me again")

    # Treasury may not approve; an approval without a reason is refused.
    treasury = logged_in(staff_member(TREASURY))
    assert treasury.post(reverse("admin:exchange_changerequest_decide", args=[request.pk]), {}).status_code == 403
    assert _decide(treasury, request.pk, "approve").status_code == 403
    client2 = logged_in(admin2)
    no_reason = _decide(client2, request.pk, "approve", reason=" ")
    assert any("reason is required" in m for m in _messages(no_reason)), _messages(no_reason)
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5000000")

    page = client2.get(reverse("admin:exchange_changerequest_change", args=[request.pk]))
    assert b'id="approve-change"' in page.content
    done = _decide(client2, request.pk, "approve", reason="feed outage confirmed")
    assert any("approved and applied" in m for m in _messages(done)), _messages(done)
    btc.refresh_from_db()
    assert btc.reference_price == Decimal(0)
    request.refresh_from_db()
    assert (request.status, request.decided_by) == (ChangeStatus.APPLIED, admin2)
    approval = StaffAction.objects.get(action="asset.approve")
    assert (approval.actor, approval.before, approval.after["reference_price"]) == (
        admin2,
        {"reference_price": "5000000"},
        "0",
    )


def test_raising_a_reference_price_applies_at_once_with_a_reason_and_an_audit_record():
    btc = NetworkFactory(coin__code="BTC", network="BTC").coin
    admin1 = staff_member(ADMINISTRATOR)
    response = _asset_change(logged_in(admin1), btc, reference_price="5100000", reason="market moved")
    assert response.status_code == 302
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5100000")
    assert not ChangeRequest.objects.exists()
    record = StaffAction.objects.get(action="asset.change")
    assert (record.before, record.after) == ({"reference_price": "5000000"}, {"reference_price": "5100000"})


def test_an_approval_is_refused_when_the_object_moved_since_the_proposal():
    btc = NetworkFactory(coin__code="BTC", network="BTC").coin
    admin1, admin2 = staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)
    outcome = changes.change_submit(actor=admin1, obj=btc, changes={"reference_price": "100"}, reason="feed")
    assert outcome.request is not None
    changes.change_submit(actor=admin1, obj=btc, changes={"reference_price": "6000000"}, reason="raised meanwhile")
    with pytest.raises(changes.ChangeRefused, match="changed since this was proposed"):
        changes.change_approve(request_id=outcome.request.pk, approved_by=admin2, reason="ok")
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("6000000")


def test_treasury_cannot_change_a_reference_price_and_support_cannot_either():
    btc = NetworkFactory(coin__code="BTC", network="BTC").coin
    for role in (TREASURY,):
        with pytest.raises(changes.ChangeRefused):
            changes.change_submit(actor=staff_member(role), obj=btc, changes={"reference_price": "1"}, reason="x")
        response = _asset_change(logged_in(staff_member(role)), btc, reference_price="1", reason="x")
        assert response.status_code == 403
    btc.refresh_from_db()
    assert btc.reference_price == Decimal("5000000")


# --- the other settings that matter to money ------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "looser", "tighter"),
    [
        ("withdraw_fee", "0", "0.001"),
        ("withdraw_min", "0.00000001", "0.01"),
        ("withdraw_max", "100000000", "1"),
        ("min_confirm", "0", "10"),
    ],
)
def test_network_settings_loosened_wait_tightened_apply(field, looser, tighter):
    network = NetworkFactory(coin__code="BTC", network="BTC")
    admin1 = staff_member(ADMINISTRATOR)
    before = Decimal(str(getattr(network, field)))

    loose = changes.change_submit(actor=admin1, obj=network, changes={field: looser}, reason="ticket 1")
    assert loose.request is not None
    assert not loose.applied
    network.refresh_from_db()
    assert Decimal(str(getattr(network, field))) == before

    tight = changes.change_submit(actor=admin1, obj=network, changes={field: tighter}, reason="ticket 2")
    assert tight.applied
    assert tight.request is None
    network.refresh_from_db()
    assert Decimal(str(getattr(network, field))) == Decimal(tighter)


def test_withdrawals_switched_on_wait_switched_off_apply_at_once():
    network = NetworkFactory(coin__code="BTC", network="BTC")
    admin1 = staff_member(ADMINISTRATOR)
    off = changes.change_submit(actor=admin1, obj=network, changes={"withdraw_enable": False}, reason="incident")
    assert off.applied
    on = changes.change_submit(actor=admin1, obj=network, changes={"withdraw_enable": True}, reason="over")
    assert on.request is not None
    assert Network.objects.get(pk=network.pk).withdraw_enable is False


def test_a_limit_raised_waits_lowered_applies_and_a_transfer_fee_lowered_waits():
    tier = LimitTier.objects.get(is_default=True)
    limit = TierLimit.objects.create(
        tier=tier, period="monthly", cash_in_limit=1000, cash_out_limit=1000, total_withdraw_limit=1000
    )
    admin1 = staff_member(ADMINISTRATOR)
    raised = changes.change_submit(actor=admin1, obj=limit, changes={"cash_out_limit": "5000"}, reason="vip")
    assert raised.request is not None
    lowered = changes.change_submit(actor=admin1, obj=limit, changes={"cash_out_limit": "500"}, reason="risk")
    assert lowered.applied
    limit.refresh_from_db()
    assert limit.cash_out_limit == Decimal(500)

    fee = TransferFee.objects.create(asset=NetworkFactory(coin__code="BTC", network="BTC").coin, fee=Decimal("0.1"))
    assert changes.change_submit(actor=admin1, obj=fee, changes={"fee": "0"}, reason="promo").request is not None
    assert changes.change_submit(actor=admin1, obj=fee, changes={"fee": "0.2"}, reason="cost").applied


def test_guarded_rows_are_not_deleted_in_the_admin():
    client = logged_in(staff_member(ADMINISTRATOR))
    network = NetworkFactory(coin__code="BTC", network="BTC")
    assert client.get(reverse("admin:wallet_network_delete", args=[network.pk])).status_code == 403
    assert client.get(reverse("admin:accounts_asset_delete", args=[network.coin_id])).status_code == 403


def test_a_rule_of_its_own_a_price_nudged_applies_moved_far_waits():
    rule = changes.moved_more_than_bps(50)
    assert not changes.loosens(rule, "100", "100.4")
    assert changes.loosens(rule, "100", "100.6")
    assert changes.loosens(rule, "100", "99.4")
    assert changes.loosens(rule, "100", "0")
    assert not changes.loosens(changes.LOWER, "100", "101")
    assert changes.loosens(changes.LOWER, "100", "not a number")
