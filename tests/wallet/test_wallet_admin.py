"""The wallet admin: networks' enable switches, withdrawal approve/reject/retry actions that call
services, the deposit travel-rule page, the whitelist form's address check, and read-only staff
who can look but not act."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from accounts.ledger.check import ledger_check
from accounts.models import Balance, User
from exchange.backoffice.models import ChangeRequest, ChangeStatus, StaffAction
from tests.support.assertions import assert_error
from tests.support.backoffice import held_deposit, trx_withdrawal
from tests.support.client import SignedClient
from tests.support.factories import demo_accounts
from tests.support.staff import ADMINISTRATOR, staff_member
from tests.support.staff import logged_in as _client
from tests.support.staff import staff_in as _staff_in
from wallet import approvals as wallet_approvals
from wallet import deposits as wallet_deposits
from wallet.chain.simulator import advance_blocks, send_to
from wallet.models import Deposit, DepositStatus, Network, WhitelistAddress, Withdrawal, WithdrawalStage

pytestmark = pytest.mark.django_db

MASTER = "master@demo.exchange"
TRX_ADDRESS = "TDemoMasterWhitezistAddress1111111"


@pytest.fixture(autouse=True)
def world(db) -> dict[str, dict]:
    """The demo's accounts, networks and master's whitelist (the factories' demo_accounts)."""
    return demo_accounts(wallet=True)


@pytest.fixture
def master_client(world) -> SignedClient:
    return SignedClient(world["master"]["api_key"], world["master"]["secret_key"])


@pytest.fixture(autouse=True)
def _settings(world, settings):
    """Rate limits out of the way; travel rule off unless a test sets a threshold."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 10**6
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**6
    settings.TRAVEL_RULE_THRESHOLD = Decimal(0)


@pytest.fixture
def superuser(db) -> User:
    return User.objects.create_superuser(email="root@wallet-admin.example", password="pw-for-tests")


@pytest.fixture
def root(superuser) -> Client:
    return _client(superuser)


@pytest.fixture
def support(make_user) -> Client:
    return _client(_staff_in(make_user, "Support"))


@pytest.fixture
def demo_master(world) -> User:
    return User.objects.get(email=MASTER)


def _usdt(user: User) -> tuple[Decimal, Decimal]:
    row = Balance.objects.get(account=user, asset__code="USDT")
    return row.free, row.locked


@pytest.fixture
def awaiting(demo_master, settings) -> Withdrawal:
    """A withdrawal waiting for an operator (threshold lowered to 100 PHP; 10 USDT is 580)."""
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("100")
    withdrawal = trx_withdrawal(demo_master)
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    return withdrawal


def _action(client: Client, model: str, action: str, pks: list[int]):
    return client.post(
        reverse(f"admin:wallet_{model}_changelist"),
        {"action": action, "_selected_action": [str(pk) for pk in pks], "index": "0", "reason": "test reason"},
    )


# --- pages -------------------------------------------------------------------------------------


def test_wallet_pages_open(root, demo_master, awaiting):
    deposit = held_deposit(demo_master)
    entry = WhitelistAddress.objects.filter(account=demo_master).first()
    network = Network.objects.get(coin__code="USDT", network="TRX")
    for url in (
        reverse("admin:wallet_network_changelist"),
        reverse("admin:wallet_network_change", args=[network.pk]),
        reverse("admin:wallet_whitelistaddress_changelist"),
        reverse("admin:wallet_whitelistaddress_change", args=[entry.pk]),
        reverse("admin:wallet_whitelistaddress_add"),
        reverse("admin:wallet_deposit_changelist"),
        reverse("admin:wallet_deposit_changelist") + "?status__exact=3",
        reverse("admin:wallet_deposit_change", args=[deposit.pk]),
        reverse("admin:wallet_withdrawal_changelist"),
        reverse("admin:wallet_withdrawal_changelist") + "?stage__exact=AWAITING_APPROVAL",
        reverse("admin:wallet_withdrawal_change", args=[awaiting.pk]),
    ):
        response = root.get(url)
        assert response.status_code == 200, (url, response.status_code)


def test_withdrawal_changelist_filters(root, superuser, awaiting, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        wallet_approvals.withdrawal_approve(withdrawal=awaiting, approved_by=superuser, reason="checked")
    url = reverse("admin:wallet_withdrawal_changelist")
    assert root.get(url + "?stage__exact=SUCCEEDED").context["cl"].result_count == 1
    assert root.get(url + "?stage__exact=AWAITING_APPROVAL").context["cl"].result_count == 0
    assert ledger_check().ok


def test_money_never_moves_by_editing_a_row(root, awaiting):
    """Withdrawals and deposits cannot be added, deleted or edited in the admin."""
    assert root.get(reverse("admin:wallet_withdrawal_add")).status_code == 403
    assert root.get(reverse("admin:wallet_deposit_add")).status_code == 403
    assert root.get(reverse("admin:wallet_withdrawal_delete", args=[awaiting.pk])).status_code == 403
    response = root.post(
        reverse("admin:wallet_withdrawal_change", args=[awaiting.pk]), {"stage": "SUCCEEDED", "amount": "1"}
    )
    awaiting.refresh_from_db()
    assert awaiting.stage == WithdrawalStage.AWAITING_APPROVAL
    assert awaiting.amount == Decimal(10)
    assert response.status_code in (200, 302, 403)
    assert ledger_check().ok


# --- networks ----------------------------------------------------------------------------------


SWITCH_ACTIONS = {
    ("withdraw_enable", False): "withdrawals_off",
    ("withdraw_enable", True): "withdrawals_on",
    ("deposit_enable", False): "deposits_off",
    ("deposit_enable", True): "deposits_on",
}


def _switches(client: Client, changes: dict[str, dict[str, bool]]):
    """Switch the named networks ("USDT/TRX": {"withdraw_enable": False}) by the changelist's
    actions, with a reason. Switching withdrawals on is only proposed (a second Administrator
    approves it: exchange/backoffice/changes.py)."""
    response = None
    for name, switches in changes.items():
        coin, network = name.split("/")
        pk = Network.objects.get(coin__code=coin, network=network).pk
        for field, on in switches.items():
            response = _action(client, "network", SWITCH_ACTIONS[(field, on)], [pk])
    return response


def _approve_change(request_id: int, reason: str = "second look: fine") -> None:
    response = _client(staff_member(ADMINISTRATOR)).post(
        reverse("admin:exchange_changerequest_decide", args=[request_id]), {"decision": "approve", "reason": reason}
    )
    assert response.status_code == 302


def test_network_switches(root, master_client):
    response = _switches(root, {"USDT/TRX": {"withdraw_enable": False}, "BTC/BTC": {"deposit_enable": False}})
    assert response.status_code == 302, response.content
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    assert (trx.withdraw_enable, trx.deposit_enable) == (False, True)
    btc = Network.objects.get(coin__code="BTC", network="BTC")
    assert (btc.withdraw_enable, btc.deposit_enable) == (True, False)
    assert Network.objects.filter(withdraw_enable=False).count() == 1
    assert Network.objects.filter(deposit_enable=False).count() == 1

    apply = master_client.post(
        "/openapi/wallet/v1/withdraw/apply", {"coin": "USDT", "network": "TRX", "address": TRX_ADDRESS, "amount": "10"}
    )
    assert_error(apply, -1010, 400)
    assert_error(master_client.get("/openapi/wallet/v1/deposit/address", {"coin": "BTC", "network": "BTC"}), -1010, 400)
    coins = {c["coin"]: c for c in master_client.get("/openapi/wallet/v1/config/getall").json()}
    assert next(n for n in coins["USDT"]["networkList"] if n["network"] == "TRX")["withdrawEnable"] is False
    assert coins["USDT"]["withdrawAllEnable"] is True  # ETH still on
    assert coins["BTC"]["depositAllEnable"] is False

    # On again: proposed (it loosens a control), applied when another Administrator approves.
    _switches(root, {"USDT/TRX": {"withdraw_enable": True}})
    assert Network.objects.get(coin__code="USDT", network="TRX").withdraw_enable is False
    proposal = ChangeRequest.objects.get(status=ChangeStatus.PROPOSED)
    _approve_change(proposal.pk)
    assert Network.objects.get(coin__code="USDT", network="TRX").withdraw_enable is True


def test_networks_cannot_be_deleted(root):
    network = Network.objects.get(coin__code="USDT", network="TRX")
    assert root.get(reverse("admin:wallet_network_delete", args=[network.pk])).status_code == 403


# --- withdrawal actions ------------------------------------------------------------------------


def test_approve_action(root, superuser, demo_master, awaiting, django_capture_on_commit_callbacks):
    free, locked = _usdt(demo_master)
    with django_capture_on_commit_callbacks(execute=True):
        response = _action(root, "withdrawal", "approve", [awaiting.pk])
    assert response.status_code == 302
    awaiting.refresh_from_db()
    assert awaiting.stage == WithdrawalStage.SUCCEEDED
    assert awaiting.decided_by == superuser
    assert awaiting.tx_id
    assert _usdt(demo_master) == (free, locked - Decimal(11))
    assert ledger_check().ok


def test_reject_action(root, superuser, demo_master, awaiting):
    free, locked = _usdt(demo_master)
    response = _action(root, "withdrawal", "reject", [awaiting.pk])
    assert response.status_code == 302
    awaiting.refresh_from_db()
    assert awaiting.stage == WithdrawalStage.FAILED
    assert awaiting.decided_by == superuser
    assert awaiting.info
    assert _usdt(demo_master) == (free + Decimal(11), locked - Decimal(11))
    assert ledger_check().ok


def test_actions_skip_withdrawals_in_other_stages(root, demo_master, awaiting, django_capture_on_commit_callbacks):
    """Approve only moves AWAITING_APPROVAL; reject does not touch a settled withdrawal."""
    with django_capture_on_commit_callbacks(execute=True):
        _action(root, "withdrawal", "approve", [awaiting.pk])
    awaiting.refresh_from_db()
    assert awaiting.stage == WithdrawalStage.SUCCEEDED
    free, locked = _usdt(demo_master)
    with django_capture_on_commit_callbacks(execute=True):
        _action(root, "withdrawal", "reject", [awaiting.pk])
        _action(root, "withdrawal", "approve", [awaiting.pk])
    awaiting.refresh_from_db()
    assert awaiting.stage == WithdrawalStage.SUCCEEDED
    assert _usdt(demo_master) == (free, locked)
    assert ledger_check().ok


def test_retry_action(root, demo_master, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        stuck = trx_withdrawal(demo_master)  # its task never ran
    assert stuck.stage == WithdrawalStage.QUEUED
    with django_capture_on_commit_callbacks(execute=True):
        response = _action(root, "withdrawal", "retry", [stuck.pk])
    assert response.status_code == 302
    stuck.refresh_from_db()
    assert stuck.stage == WithdrawalStage.SUCCEEDED
    # Retrying a settled one does nothing.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        _action(root, "withdrawal", "retry", [stuck.pk])
    assert callbacks == []
    assert ledger_check().ok


def test_reject_a_queued_withdrawal(root, demo_master, django_capture_on_commit_callbacks):
    free, _ = _usdt(demo_master)
    with django_capture_on_commit_callbacks(execute=False):
        queued = trx_withdrawal(demo_master)
    _action(root, "withdrawal", "reject", [queued.pk])
    queued.refresh_from_db()
    assert queued.stage == WithdrawalStage.FAILED
    assert _usdt(demo_master)[0] == free
    assert ledger_check().ok


# --- deposits: travel rule ---------------------------------------------------------------------


def test_travel_rule_page(root, superuser, demo_master):
    deposit = held_deposit(demo_master)
    free, _ = _usdt(demo_master)
    page = reverse("admin:wallet_deposit_travel_rule", args=[deposit.pk])
    assert page == f"/admin/wallet/deposit/{deposit.pk}/travel-rule/"
    change = root.get(reverse("admin:wallet_deposit_change", args=[deposit.pk]))
    assert page.encode() in change.content
    assert root.get(page).status_code == 200

    invalid = root.post(page, {"originator_name": ""})
    assert invalid.status_code == 200
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.NEED_FILL_DATA

    response = root.post(
        page,
        {
            "originator_name": "Juan dela Cruz",
            "originator_address": "Makati",
            "originator_vasp": "Other VASP",
            "reason": "sender's VASP sent it",
        },
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:wallet_deposit_change", args=[deposit.pk])
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert deposit.travel_rule_data["originator_name"] == "Juan dela Cruz"
    assert deposit.travel_rule_data["filled_by"] == superuser.email
    assert _usdt(demo_master)[0] == free + 20
    # No link any more; posting again changes nothing.
    assert page.encode() not in root.get(reverse("admin:wallet_deposit_change", args=[deposit.pk])).content
    root.post(page, {"originator_name": "Someone else", "reason": "again"})
    deposit.refresh_from_db()
    assert deposit.travel_rule_data["originator_name"] == "Juan dela Cruz"
    assert _usdt(demo_master)[0] == free + 20
    assert ledger_check().ok


def test_travel_rule_then_confirmations(root, demo_master, settings):
    """Filled before the confirmations: the deposit proceeds to PROCESSING, then the scan credits it."""
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    settings.TRAVEL_RULE_THRESHOLD = Decimal("1000")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("25"))
    wallet_deposits.deposits_scan()
    deposit = Deposit.objects.get()
    assert deposit.status == DepositStatus.NEED_FILL_DATA
    free, _ = _usdt(demo_master)
    root.post(reverse("admin:wallet_deposit_travel_rule", args=[deposit.pk]), {"originator_name": "A", "reason": "r"})
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.PROCESSING
    advance_blocks(3, network="TRX")
    wallet_deposits.deposits_scan()
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert _usdt(demo_master)[0] == free + 25
    assert ledger_check().ok


def test_travel_rule_page_unknown_deposit(root):
    assert root.get("/admin/wallet/deposit/999999/travel-rule/").status_code == 404


def test_recheck_action(root, demo_master):
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("4"))
    wallet_deposits.deposits_scan()
    deposit = Deposit.objects.get()
    advance_blocks(3, network="TRX")
    response = _action(root, "deposit", "recheck", [deposit.pk])
    assert response.status_code == 302
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert ledger_check().ok


# --- whitelist form ----------------------------------------------------------------------------


def _add_entry(
    client: Client, account: User, network: Network, address: str, tag: str = "", reason: str = "customer's form 12"
):
    return client.post(
        reverse("admin:wallet_whitelistaddress_add"),
        {
            "account": str(account.pk),
            "network": str(network.pk),
            "address": address,
            "tag": tag,
            "name": "cold",
            "reason": reason,
            "_save": "Save",
        },
    )


@pytest.mark.parametrize(
    "address",
    [
        "0x00000000000000000000000000000000000d3e40",  # an ETH address on TRX
        "TShort",
        "TDemoMasterWhitezistAddress1111110",  # 0 is not base58
        "TDemoMasterWhitezistAddress11111111",  # one character too many
    ],
)
def test_whitelist_form_rejects_an_address_not_matching_the_network(root, demo_master, address):
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    before = WhitelistAddress.objects.count()
    response = _add_entry(root, demo_master, trx, address)
    assert response.status_code == 200
    assert "address" in response.context["adminform"].form.errors
    assert WhitelistAddress.objects.count() == before


def test_whitelist_form_accepts_a_matching_address(root, make_user, master_client):
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    user = make_user()
    response = _add_entry(root, user, trx, "TNewCo1dWa11etAddress1111111111111")
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else None
    entry = WhitelistAddress.objects.get(account=user)
    assert (entry.address, entry.tag, entry.name, entry.network) == (
        "TNewCo1dWa11etAddress1111111111111",
        "",
        "cold",
        trx,
    )


def test_whitelist_form_tag_rules(root, demo_master):
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    address = "TNewCo1dWa11etAddress1111111111111"
    response = _add_entry(root, demo_master, trx, address, tag="123")
    assert response.status_code == 200
    assert "tag" in response.context["adminform"].form.errors  # TRX has no memo
    Network.objects.filter(pk=trx.pk).update(memo_regex=r"^[0-9]{3,10}$")
    response = _add_entry(root, demo_master, trx, address, tag="abc")
    assert response.status_code == 200
    assert "tag" in response.context["adminform"].form.errors
    assert _add_entry(root, demo_master, trx, address, tag="123").status_code == 302
    assert WhitelistAddress.objects.filter(account=demo_master, address=address, tag="123").exists()


def _whitelist_audit() -> list[tuple[str, str, dict, dict]]:
    rows = StaffAction.objects.filter(action__startswith="whitelist.").order_by("id")
    return list(rows.values_list("action", "reason", "before", "after"))


def test_an_entry_is_added_only_with_a_reason_and_audited(make_user):
    """Issue 34: entries were added and changed with no reason and no audit."""
    admin = staff_member(ADMINISTRATOR)
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    user = make_user()
    address = "TNewCo1dWa11etAddress1111111111111"
    refused = _add_entry(_client(admin), user, trx, address, reason="  ")
    assert refused.status_code == 200
    assert "reason" in refused.context["adminform"].form.errors
    assert not WhitelistAddress.objects.filter(account=user).exists()
    assert _whitelist_audit() == []

    assert _add_entry(_client(admin), user, trx, address, reason="signed form, ticket 12").status_code == 302
    entry = WhitelistAddress.objects.get(account=user)
    [(action, reason, before, after)] = _whitelist_audit()
    assert (action, reason, before) == ("whitelist.create", "signed form, ticket 12", {})
    assert (after["account"], after["network"], after["address"]) == (user.pk, trx.pk, address)
    record = StaffAction.objects.get(action="whitelist.create")
    assert (record.actor_id, record.object_type, record.object_id) == (
        admin.pk,
        "wallet.whitelistaddress",
        str(entry.pk),
    )


def test_an_entry_is_changed_only_with_a_reason_and_audited(demo_master):
    admin = _client(staff_member(ADMINISTRATOR))
    entry = WhitelistAddress.objects.get(account=demo_master, address=TRX_ADDRESS)
    change = reverse("admin:wallet_whitelistaddress_change", args=[entry.pk])
    new_address = "TNewCo1dWa11etAddress1111111111111"
    data = {
        "account": str(demo_master.pk),
        "network": str(entry.network_id),
        "address": new_address,
        "tag": "",
        "name": entry.name,
        "_save": "Save",
    }
    refused = admin.post(change, {**data, "reason": ""})
    assert refused.status_code == 200
    assert "reason" in refused.context["adminform"].form.errors
    entry.refresh_from_db()
    assert entry.address == TRX_ADDRESS
    assert _whitelist_audit() == []

    bad = admin.post(change, {**data, "address": "0x00000000000000000000000000000000000d3e40", "reason": "x"})
    assert bad.status_code == 200
    assert "address" in bad.context["adminform"].form.errors

    assert admin.post(change, {**data, "reason": "customer moved wallets, ticket 31"}).status_code == 302
    entry.refresh_from_db()
    assert entry.address == new_address
    assert _whitelist_audit() == [
        ("whitelist.change", "customer moved wallets, ticket 31", {"address": TRX_ADDRESS}, {"address": new_address})
    ]


def test_an_entry_is_removed_only_with_a_reason_and_audited(demo_master):
    admin = _client(staff_member(ADMINISTRATOR))
    entry = WhitelistAddress.objects.get(account=demo_master, address=TRX_ADDRESS)
    assert (
        admin.post(reverse("admin:wallet_whitelistaddress_delete", args=[entry.pk]), {"post": "yes"}).status_code == 403
    )

    def remove(reason: str):
        return admin.post(
            reverse("admin:wallet_whitelistaddress_changelist"),
            {"action": "remove", "_selected_action": [str(entry.pk)], "index": "0", "reason": reason},
            follow=True,
        )

    refused = remove("")
    assert any("reason is required" in str(m) for m in refused.context["messages"])
    assert WhitelistAddress.objects.filter(pk=entry.pk).exists()
    remove("customer asked, ticket 40")
    assert not WhitelistAddress.objects.filter(pk=entry.pk).exists()
    [(action, reason, before, after)] = _whitelist_audit()
    assert (action, reason, before["address"], after) == (
        "whitelist.remove",
        "customer asked, ticket 40",
        TRX_ADDRESS,
        {"removed": True},
    )


# --- read-only staff ---------------------------------------------------------------------------


def test_support_can_look(support, awaiting, demo_master):
    deposit = held_deposit(demo_master)
    for url in (
        reverse("admin:wallet_network_changelist"),
        reverse("admin:wallet_whitelistaddress_changelist"),
        reverse("admin:wallet_deposit_changelist"),
        reverse("admin:wallet_deposit_change", args=[deposit.pk]),
        reverse("admin:wallet_withdrawal_changelist"),
        reverse("admin:wallet_withdrawal_change", args=[awaiting.pk]),
    ):
        assert support.get(url).status_code == 200, url


def test_support_cannot_run_withdrawal_actions(support, demo_master, awaiting, django_capture_on_commit_callbacks):
    free, locked = _usdt(demo_master)
    for action in ("approve", "reject", "retry"):
        with django_capture_on_commit_callbacks(execute=True):
            response = _action(support, "withdrawal", action, [awaiting.pk])
        assert response.status_code in (200, 302, 403), (action, response.status_code)
        awaiting.refresh_from_db()
        assert awaiting.stage == WithdrawalStage.AWAITING_APPROVAL, action
        assert awaiting.decided_by is None
    assert _usdt(demo_master) == (free, locked)
    changelist = support.get(reverse("admin:wallet_withdrawal_changelist"))
    assert b'value="approve"' not in changelist.content
    assert b'value="reject"' not in changelist.content
    assert ledger_check().ok


def test_support_cannot_switch_networks(support, root):
    for network in Network.objects.all():
        response = _switches(support, {f"{network.coin.code}/{network.network}": {"withdraw_enable": False}})
        assert response.status_code in (200, 302, 403)
        response = _switches(support, {f"{network.coin.code}/{network.network}": {"deposit_enable": False}})
        assert response.status_code in (200, 302, 403)
    assert not Network.objects.filter(withdraw_enable=False).exists()
    assert not Network.objects.filter(deposit_enable=False).exists()


def test_support_cannot_fill_travel_rule(support, demo_master):
    deposit = held_deposit(demo_master)
    page = reverse("admin:wallet_deposit_travel_rule", args=[deposit.pk])
    assert support.get(page).status_code == 403
    assert support.post(page, {"originator_name": "x"}).status_code == 403
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.NEED_FILL_DATA
    assert deposit.travel_rule_data is None
    assert ledger_check().ok


def test_support_cannot_add_whitelist_entries(support, demo_master):
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    before = WhitelistAddress.objects.count()
    response = _add_entry(support, demo_master, trx, "TNewCo1dWa11etAddress1111111111111")
    assert response.status_code == 403
    assert WhitelistAddress.objects.count() == before


def test_operations_staff_run_the_wallet(make_user, demo_master, awaiting, django_capture_on_commit_callbacks):
    """Operators (the Operations group, not only superusers) approve withdrawals, fill travel-rule
    data, switch networks and manage the whitelist: the issue has operators do all four."""
    ops = _client(_staff_in(make_user, "Administrator"))
    with django_capture_on_commit_callbacks(execute=True):
        _action(ops, "withdrawal", "approve", [awaiting.pk])
    awaiting.refresh_from_db()
    assert awaiting.stage == WithdrawalStage.SUCCEEDED
    deposit = held_deposit(demo_master)
    assert ops.get(reverse("admin:wallet_deposit_travel_rule", args=[deposit.pk])).status_code == 200
    trx = Network.objects.get(coin__code="USDT", network="TRX")
    assert _add_entry(ops, demo_master, trx, "TNewCo1dWa11etAddress1111111111111").status_code == 302
    _switches(ops, {"USDT/TRX": {"withdraw_enable": False}})
    assert Network.objects.get(pk=trx.pk).withdraw_enable is False
    assert ledger_check().ok
