"""Issue 25, finding 3: one Administrator could move a customer's money by other means.

(a) Re-parenting: admin1 made `peer` a sub-account of another master, which then pulled peer's
    PHP by universal transfer. Now an account's master changes only through exchange/backoffice/changes.py:
    refused while the account holds anything, and, when empty, applied only when a second
    Administrator approves it.
(b) API keys: admin1 created a full key on a customer's account, was shown its secret, and
    transferred 100 PHP away with it. Now a key made by staff is Read only (its writes are refused,
    -1020), and staff may only narrow a key's types, never widen them.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.urls import reverse

from accounts import services as account_services
from accounts.models import ApiKey, User
from exchange.backoffice import changes
from exchange.backoffice.models import ChangeRequest, ChangeStatus, StaffAction
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.backoffice import change_user, page_messages
from tests.support.client import SignedClient
from tests.support.factories import customer
from tests.support.staff import ADMINISTRATOR, logged_in, staff_member
from wallet.models import Transfer

pytestmark = pytest.mark.django_db

TRANSFER = "/openapi/transfer/v4/transfers"
UNIVERSAL = "/openapi/v1/sub-account/transfer/universal-transfer"
SECRET_RE = re.compile(r'id="secret-key"[^>]*>\s*([A-Za-z0-9]+)\s*<')
KEY_RE = re.compile(r'id="api-key"[^>]*>\s*([A-Za-z0-9]+)\s*<')


_change_user = change_user
_messages = page_messages


# --- (a) re-parenting -----------------------------------------------------------------------------


def test_the_reproduction_a_funded_account_cannot_be_moved_under_another_master():
    peer = customer(email="peer@test.example", funding={"PHP": "4000"})
    thief_master = customer(email="other-master@test.example")
    admin1 = staff_member(ADMINISTRATOR)

    response = _change_user(logged_in(admin1), peer.user, master=str(thief_master.user.pk), reason="merge accounts")
    assert any("still holds 4000 PHP" in m for m in _messages(response)), _messages(response)
    peer.user.refresh_from_db()
    assert peer.user.master_id is None
    assert not ChangeRequest.objects.exists()
    assert not StaffAction.objects.exists()

    # The other master cannot pull peer's money: peer is not its sub-account.
    pulled = thief_master.client.post(
        UNIVERSAL,
        {"fromEmail": peer.user.email, "toEmail": thief_master.user.email, "asset": "PHP", "amount": "4000"},
    )
    assert pulled.status_code != 200
    assert_balance(peer.user, "PHP", "4000")
    assert_ledger_balanced()


def test_an_empty_account_is_re_parented_only_when_a_second_administrator_approves():
    peer = customer(email="peer@test.example")
    new_master = customer(email="new-master@test.example")
    admin1, admin2 = staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)

    response = _change_user(logged_in(admin1), peer.user, master=str(new_master.user.pk), reason="customer's letter")
    assert any("another Administrator must approve it" in m for m in _messages(response)), _messages(response)
    peer.user.refresh_from_db()
    assert peer.user.master_id is None
    request = ChangeRequest.objects.get()
    assert request.changes == {"master": new_master.user.pk}
    assert StaffAction.objects.filter(action="account.propose", actor=admin1).exists()

    with pytest.raises(changes.ChangeRefused, match="another Administrator"):
        changes.change_approve(request_id=request.pk, approved_by=admin1, reason="me")
    changes.change_approve(request_id=request.pk, approved_by=admin2, reason="letter verified by phone")
    peer.user.refresh_from_db()
    assert peer.user.master_id == new_master.user.pk
    request.refresh_from_db()
    assert (request.status, request.decided_by) == (ChangeStatus.APPLIED, admin2)
    assert StaffAction.objects.filter(action="account.approve", actor=admin2).exists()


def test_money_arriving_after_the_proposal_refuses_the_approval():
    from tests.support.factories import fund

    peer = customer(email="peer@test.example")
    new_master = customer(email="new-master@test.example")
    admin1, admin2 = staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)
    outcome = changes.change_submit(
        actor=admin1, obj=peer.user, changes={"master": new_master.user.pk}, reason="customer's letter"
    )
    fund(peer.user, "PHP", "10")
    with pytest.raises(changes.ChangeRefused, match="still holds 10 PHP"):
        changes.change_approve(request_id=outcome.request.pk, approved_by=admin2, reason="ok")
    peer.user.refresh_from_db()
    assert peer.user.master_id is None


def test_a_master_or_tier_change_is_not_mixed_with_other_fields():
    peer = customer(email="peer@test.example")
    new_master = customer(email="new-master@test.example")
    response = _change_user(
        logged_in(staff_member(ADMINISTRATOR)),
        peer.user,
        master=str(new_master.user.pk),
        base_token="USDT",
        reason="x",
    )
    assert any("on their own" in m for m in _messages(response)), _messages(response)
    peer.user.refresh_from_db()
    assert (peer.user.master_id, peer.user.base_token) == (None, "PHP")
    assert not ChangeRequest.objects.exists()


# --- (b) API keys ---------------------------------------------------------------------------------


def _add_key(client, user: User, **fields):
    data = {"user": user.pk, "name": "desk", "ip_list": "", "reason": "customer asked", "_save": "Save", **fields}
    return client.post(reverse("admin:accounts_apikey_add"), data)


def test_the_reproduction_a_key_made_by_an_administrator_cannot_move_the_customers_money():
    peer = customer(email="peer@test.example", funding={"PHP": "1000"})
    thief = customer(email="thief@test.example")
    admin1 = staff_member(ADMINISTRATOR)

    # Every functional type asked for (a crafted POST): the key is made Read only anyway.
    response = _add_key(
        logged_in(admin1),
        peer.user,
        types=["Enable Fiat", "Enable Crypto Wallet", "Enable Spot", "Enable Convert", "Enable Account"],
    )
    assert response.status_code == 200, response.content[:500]
    html = response.content.decode()
    key, secret = KEY_RE.search(html).group(1), SECRET_RE.search(html).group(1)
    assert ApiKey.objects.get(key=key).types == ["Read only"]

    moved = SignedClient(key, secret).post(
        TRANSFER, {"account": "PHP", "target_address": thief.user.email, "amount": "100"}
    )
    assert_error(moved, -1020, 401, msg_contains="read-only API key")
    assert_balance(peer.user, "PHP", "1000")
    assert not Transfer.objects.exists()
    assert SignedClient(key, secret).get("/openapi/v1/account").status_code == 200  # it reads
    assert_ledger_balanced()


def test_the_service_refuses_a_functional_key_for_staff():
    peer = customer(email="peer@test.example")
    for types in (["Enable Fiat"], [], ["Enable Spot", "Read only", "Enable Fiat"][2:]):
        with pytest.raises(account_services.StaffChangeRefused, match="read-only keys only"):
            account_services.api_key_issue_by_staff(
                user=peer.user, name="x", types=types, ip_list=None, ip_restrict=None
            )


def test_staff_cannot_widen_a_keys_types():
    peer = customer(email="peer@test.example", funding={"PHP": "1000"})
    admin1 = staff_member(ADMINISTRATOR)
    made = _add_key(logged_in(admin1), peer.user)
    key = ApiKey.objects.get(key=KEY_RE.search(made.content.decode()).group(1))
    url = reverse("admin:accounts_apikey_change", args=[key.pk])
    form = {"name": key.name, "status": "ENABLE", "ip_list": "", "reason": "customer wants to trade", "_save": "Save"}

    widened = logged_in(admin1).post(url, {**form, "types": ["Enable Fiat"]})
    assert widened.status_code == 200
    assert b"Staff may only narrow a key&#x27;s types" in widened.content
    key.refresh_from_db()
    assert key.types == ["Read only"]
    with pytest.raises(account_services.StaffChangeRefused):
        account_services.api_key_change_by_staff(
            api_key=key, name="x", types=["Enable Fiat"], enabled=True, ip_restrict=False, ip_list=[]
        )

    # A customer's full key may be narrowed (incident response), and then not widened back.
    full = peer.api_key
    url = reverse("admin:accounts_apikey_change", args=[full.pk])
    narrowed = logged_in(admin1).post(url, {**form, "name": full.name, "types": ["Enable Spot"]})
    assert narrowed.status_code == 302, narrowed.content[:500]
    full.refresh_from_db()
    assert full.types == ["Enable Spot"]
    back = logged_in(admin1).post(url, {**form, "name": full.name, "types": ["Enable Spot", "Enable Fiat"]})
    assert back.status_code == 200
    full.refresh_from_db()
    assert full.types == ["Enable Spot"]
    assert Decimal(1000) == peer.user.balances.get(asset__code="PHP").free
