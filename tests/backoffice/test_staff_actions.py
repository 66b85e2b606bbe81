"""The last audited staff actions that lived in admin code (issue 36, item 3, the rest): freezing
an account, creating, changing, enabling and disabling an API key (accounts/staff.py), switching a
business and lifting a ban (exchange/platform/services.py), asking the chain again for deposits
(wallet/deposits.py) and handing a stuck withdrawal to a worker again (wallet/approvals.py). Each
service is called directly, as a management command or a future API would: a staff member without
the permission is refused (a PermissionDenied), nothing changes and nothing is recorded; one with
it leaves the audit row without any admin code running. The convert liquidity top-up's are in
tests/convert/test_liquidity_staff.py. And no admin module writes an audit row itself."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import PermissionDenied

from accounts import staff
from accounts.models import ApiKey, ApiKeyStatus, ApiKeyType
from accounts.services import StaffChangeRefused
from exchange.api.models import RateLimitBan
from exchange.backoffice.models import StaffAction
from exchange.platform import services as platform_services
from exchange.platform.models import BusinessStatus
from tests.support.backoffice import banned_ip, trx_withdrawal, usdt_customer
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.staff import ADMINISTRATOR, SUPPORT, TREASURY, staff_member
from wallet import approvals
from wallet import deposits as wallet_deposits
from wallet.chain.simulator import send_to
from wallet.models import Deposit, WithdrawalStage

pytestmark = pytest.mark.django_db


def _unprivileged():
    """A Support member (read-only), a customer and a deactivated Administrator."""
    retired = staff_member(ADMINISTRATOR)
    retired.is_active = False
    retired.save(update_fields=["is_active"])
    return [staff_member(SUPPORT), UserFactory(), retired]


def _audited(action: str) -> StaffAction:
    return StaffAction.objects.get(action=action)


# --- accounts and keys -----------------------------------------------------------------------------


def test_freezing_an_account_without_the_permission_is_refused_and_nothing_changes():
    alice = UserFactory()
    for someone in [*_unprivileged(), staff_member(TREASURY)]:
        with pytest.raises(PermissionDenied, match="may not freeze"):
            staff.account_set_frozen(actor=someone, user=alice, frozen=True, reason="fraud report 7")
    alice.refresh_from_db()
    assert not alice.is_frozen
    assert not StaffAction.objects.exists()


def test_the_freeze_service_writes_its_own_audit_row_and_leaves_staff_accounts_alone():
    admin, alice = staff_member(ADMINISTRATOR), UserFactory()
    staff.account_set_frozen(actor=admin, user=alice, frozen=True, reason="fraud report 7")
    alice.refresh_from_db()
    assert alice.is_frozen
    row = _audited("account.freeze")
    assert (row.actor, row.object_id, row.reason) == (admin, str(alice.pk), "fraud report 7")
    assert (row.before["is_frozen"], row.after["is_frozen"]) == (False, True)
    staff.account_set_frozen(actor=admin, user=alice, frozen=False, reason="cleared")
    assert _audited("account.unfreeze").after["is_frozen"] is False
    colleague = staff_member(SUPPORT)
    with pytest.raises(StaffChangeRefused):
        staff.account_set_frozen(actor=admin, user=colleague, frozen=True, reason="no")
    colleague.refresh_from_db()
    assert not colleague.is_frozen
    assert StaffAction.objects.count() == 2


def test_the_key_services_without_the_permission_are_refused_and_nothing_changes():
    alice = UserFactory()
    key, _secret = ApiKeyFactory(user=alice)
    before = (key.name, key.status, key.types)
    for someone in [*_unprivileged(), staff_member(TREASURY)]:
        with pytest.raises(PermissionDenied, match="may not create API keys"):
            staff.api_key_issue(
                actor=someone, user=alice, name="support", types=None, ip_list=[], ip_restrict=False, reason="asked"
            )
        with pytest.raises(PermissionDenied, match="may not change API keys"):
            staff.api_key_change(
                actor=someone,
                api_key=key,
                name="renamed",
                types=[ApiKeyType.READ_ONLY],
                enabled=False,
                ip_restrict=False,
                ip_list=[],
                reason="asked",
            )
        with pytest.raises(PermissionDenied, match="may not enable or disable API keys"):
            staff.api_key_set_status(actor=someone, api_key=key, enabled=False, reason="leaked")
    key.refresh_from_db()
    assert (key.name, key.status, key.types) == before
    assert list(ApiKey.objects.filter(user=alice)) == [key]
    assert not StaffAction.objects.exists()


def test_the_key_services_write_their_own_audit_rows_and_never_the_secret():
    admin, alice = staff_member(ADMINISTRATOR), UserFactory()
    created = staff.api_key_issue(
        actor=admin, user=alice, name="support", types=None, ip_list=["192.0.2.1"], ip_restrict=True, reason="asked"
    )
    assert created.api_key.types == [ApiKeyType.READ_ONLY]
    row = _audited("api_key.create")
    assert (row.actor, row.object_id, row.reason) == (admin, str(created.api_key.pk), "asked")
    assert created.secret not in str(row.after)
    staff.api_key_change(
        actor=admin,
        api_key=created.api_key,
        name="renamed",
        types=[ApiKeyType.READ_ONLY],
        enabled=True,
        ip_restrict=False,
        ip_list=[],
        reason="customer's call",
    )
    changed = _audited("api_key.change")
    assert (changed.before["name"], changed.after["name"]) == ("support", "renamed")
    staff.api_key_set_status(actor=admin, api_key=created.api_key, enabled=False, reason="leaked")
    created.api_key.refresh_from_db()
    assert created.api_key.status == ApiKeyStatus.NOT_ENABLE
    assert _audited("api_key.disable").after["status"] == ApiKeyStatus.NOT_ENABLE
    staff.api_key_set_status(actor=admin, api_key=created.api_key, enabled=True, reason="rotated")
    assert _audited("api_key.enable").after["status"] == ApiKeyStatus.ENABLE


# --- business status and bans ----------------------------------------------------------------------


def test_switching_a_business_or_lifting_a_ban_without_the_permission_is_refused():
    ban = banned_ip()
    for someone in [*_unprivileged(), staff_member(TREASURY)]:
        with pytest.raises(PermissionDenied, match="may not switch businesses"):
            platform_services.business_status_switch(actor=someone, business_type="SPOT", is_on=False, reason="x")
        with pytest.raises(PermissionDenied, match="may not lift bans"):
            platform_services.ban_lift(actor=someone, ban=ban, reason="our own office")
    assert BusinessStatus.objects.get(business_type="SPOT").is_on
    ban.refresh_from_db()
    assert ban.lifted_at is None
    assert not StaffAction.objects.exists()


def test_the_business_and_ban_services_write_their_own_audit_rows():
    admin = staff_member(ADMINISTRATOR)
    stored = platform_services.business_status_switch(
        actor=admin, business_type="SPOT", is_on=False, reason="maintenance"
    )
    assert (stored.is_on, stored.updated_by) == (False, admin)
    row = _audited("business_status.set")
    assert (row.actor, row.object_id, row.before["is_on"], row.after["is_on"]) == (admin, str(stored.pk), True, False)
    ban = banned_ip()
    lifted = platform_services.ban_lift(actor=admin, ban=ban, reason="our own office")
    assert (lifted.lifted_by, lifted.lifted_at is not None) == (admin, True)
    row = _audited("ban.lift")
    assert (row.actor, row.object_id, row.reason) == (admin, str(ban.pk), "our own office")
    assert not RateLimitBan.objects.filter(pk=ban.pk, lifted_at__isnull=True).exists()


# --- deposits and withdrawals ----------------------------------------------------------------------


def _incoming_deposit() -> None:
    alice = usdt_customer("0")
    address = wallet_deposits.deposit_address_get(account=alice.user, coin="USDT", network="TRX")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("4"))


def test_rechecking_deposits_without_the_permission_is_refused_and_the_chain_is_not_asked():
    _incoming_deposit()
    for someone in _unprivileged():
        with pytest.raises(PermissionDenied, match="may not check the chain"):
            wallet_deposits.deposits_recheck(checked_by=someone, reason="customer says it was sent")
    assert not Deposit.objects.exists()
    assert not StaffAction.objects.exists()


def test_the_recheck_service_writes_its_own_audit_row():
    _incoming_deposit()
    treasurer = staff_member(TREASURY)
    assert wallet_deposits.deposits_recheck(checked_by=treasurer, reason="customer says it was sent") == 1
    assert Deposit.objects.count() == 1
    row = _audited("deposit.recheck")
    assert (row.actor, row.after) == (treasurer, {"credited_or_advanced": 1})


def test_retrying_a_withdrawal_without_the_permission_is_refused_and_nothing_is_handed_over(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=False):
        stuck = trx_withdrawal(usdt_customer("100").user)  # its task never ran
    assert stuck.stage == WithdrawalStage.QUEUED
    for someone in _unprivileged():
        refused = pytest.raises(PermissionDenied, match="may not retry withdrawals")
        with django_capture_on_commit_callbacks(execute=False) as handed, refused:
            approvals.withdrawal_retry_by_staff(withdrawal=stuck, retried_by=someone, reason="stuck for an hour")
        assert handed == []
    assert not StaffAction.objects.exists()


def test_the_retry_service_writes_its_own_audit_row(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        stuck = trx_withdrawal(usdt_customer("100").user)
    treasurer = staff_member(TREASURY)
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.withdrawal_retry_by_staff(withdrawal=stuck, retried_by=treasurer, reason="stuck")
    stuck.refresh_from_db()
    assert stuck.stage == WithdrawalStage.SUCCEEDED  # handed to a worker, which sent it
    row = _audited("withdrawal.retry")
    assert (row.actor, row.object_id, row.before["stage"]) == (treasurer, str(stuck.pk), WithdrawalStage.QUEUED)
    # A settled one is left as it is: nothing handed over, nothing recorded.
    with django_capture_on_commit_callbacks(execute=True) as handed:
        assert not approvals.withdrawal_retry_by_staff(withdrawal=stuck, retried_by=treasurer, reason="again")
    assert handed == []
    assert StaffAction.objects.count() == 1


# --- the admin only calls the services -------------------------------------------------------------


def test_no_admin_module_writes_an_audit_row_itself():
    root = Path(settings.BASE_DIR)
    writers = sorted(
        str(path.relative_to(root))
        for app in ("accounts", "convert", "exchange", "subaccounts", "streams", "wallet")
        for path in (root / app).rglob("admin.py")
        if "staff_action(" in path.read_text()
    )
    assert writers == []
