"""Issue 34, finding 1: one Administrator could redirect a customer's incoming payments by moving
the customer's e-mail (the address P2P transfers are sent to) to another account in the admin;
phones had no uniqueness at all. Now every change of an account's e-mail, phone, master, virtual
flag, limit tier (and its withdrawal whitelist switched off) goes through the four-eyes service
(accounts.services.user_change_by_staff -> exchange.backoffice.changes): proposed by one
Administrator with a reason, applied only when another approves, audited. Phones are unique
compared normalised (accounts/phones.py), in the database.

Also (issue 34, "Also found"): the admin's "Add user" form let one person create an account under
any master. The account is now created on its own, and putting it under the master is a proposal
for a second Administrator.

Every reproduction goes through the admin as staff use it (a logged-in staff client posting the
change form) and the customer's transfer through the signed API."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from accounts import services as account_services
from accounts.models import User
from exchange.backoffice import changes
from exchange.backoffice.models import ChangeRequest, ChangeStatus, StaffAction
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.backoffice import change_user, page_messages
from tests.support.factories import UserFactory, customer
from tests.support.staff import ADMINISTRATOR, SUPPORT, logged_in, staff_member
from wallet.models import Transfer

pytestmark = pytest.mark.django_db

TRANSFER = "/openapi/transfer/v4/transfers"
SUB_LIST = "/openapi/v1/sub-account/list"
PEER = "peer@demo.exchange"


def _send(sender, address: str, amount: str = "10"):
    return sender.client.post(TRANSFER, {"account": "PHP", "target_address": address, "amount": amount})


def _decide(client, request: ChangeRequest, decision: str = "approve", reason: str = "customer's letter checked"):
    url = reverse("admin:exchange_changerequest_decide", args=[request.pk])
    return client.post(url, {"decision": decision, "reason": reason}, follow=True)


@pytest.fixture
def world(settings):
    # A transfer weighs 50: these tests send more than the default minute's allowance allows.
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 100_000
    peer = customer(email=PEER, phone="+639170000002")
    other = customer(email="other@test.example")
    sender = customer(funding={"PHP": "1000"})
    admin1 = staff_member(ADMINISTRATOR, email="admin1@staff.example")
    admin2 = staff_member(ADMINISTRATOR, email="admin2@staff.example")
    return peer, other, sender, admin1, admin2


def test_the_reproduction_one_administrator_cannot_redirect_a_customers_payments(world):
    peer, other, sender, admin1, admin2 = world
    one = logged_in(admin1)

    # The audit's first step: move the peer's e-mail away. Only proposed.
    moved = change_user(one, peer.user, email="peer-old@test.example", reason="customer asked by phone")
    assert any("another Administrator must approve it" in m for m in page_messages(moved)), page_messages(moved)
    peer.user.refresh_from_db()
    assert peer.user.email == PEER
    request = ChangeRequest.objects.get()
    assert (request.changes, request.before, request.loosens) == (
        {"email": "peer-old@test.example"},
        {"email": PEER},
        ["email"],
    )
    proposed = StaffAction.objects.get(action="account.propose")
    assert (proposed.actor, proposed.object_id, proposed.reason) == (
        admin1,
        str(peer.user.pk),
        "customer asked by phone",
    )
    assert not StaffAction.objects.filter(action="account.change").exists()

    # Second step: give peer@demo.exchange to another account. Refused: the peer still has it.
    taken = change_user(one, other.user, email=PEER, reason="typo fix")
    assert taken.status_code == 200
    assert "An account with this e-mail already exists." in str(taken.context["adminform"].form.errors)
    other.user.refresh_from_db()
    assert other.user.email == "other@test.example"

    # The customer's transfer to peer@demo.exchange still credits the peer.
    response = _send(sender, PEER)
    assert response.status_code == 200, response.content
    assert Transfer.objects.get().recipient_id == peer.user.pk
    assert_balance(peer.user, "PHP", "10")
    assert_balance(other.user, "PHP", "0")

    # The proposer cannot approve it; another Administrator can, and then it is applied.
    own = _decide(one, request)
    assert any("another Administrator must approve it" in m for m in page_messages(own)), page_messages(own)
    peer.user.refresh_from_db()
    assert peer.user.email == PEER
    done = _decide(logged_in(admin2), request)
    assert any("approved and applied" in m for m in page_messages(done)), page_messages(done)
    peer.user.refresh_from_db()
    assert peer.user.email == "peer-old@test.example"
    request.refresh_from_db()
    assert (request.status, request.proposed_by, request.decided_by) == (ChangeStatus.APPLIED, admin1, admin2)
    approved = StaffAction.objects.get(action="account.approve")
    assert (approved.actor, approved.before, approved.after["email"]) == (
        admin2,
        {"email": PEER},
        "peer-old@test.example",
    )

    # The old address now reaches nobody; the new one reaches the peer.
    assert_error(_send(sender, PEER), -1151, 404)
    assert _send(sender, "peer-old@test.example").status_code == 200
    assert_balance(peer.user, "PHP", "20")
    assert_ledger_balanced()


def test_giving_a_freed_address_to_another_account_waits_too(world):
    peer, other, sender, admin1, admin2 = world
    outcome = account_services.user_change_by_staff(
        actor=admin1, user=peer.user, changes={"email": "peer-old@test.example"}, reason="r"
    )
    changes.change_approve(request_id=outcome.request.pk, approved_by=admin2, reason="ok")

    response = change_user(logged_in(admin1), other.user, email=PEER, reason="customer asked")
    assert any("another Administrator must approve it" in m for m in page_messages(response))
    other.user.refresh_from_db()
    assert other.user.email == "other@test.example"
    assert_error(_send(sender, PEER), -1151, 404)
    assert_balance(other.user, "PHP", "0")


def test_an_address_taken_after_the_proposal_refuses_the_approval(world):
    peer, _, _, admin1, admin2 = world
    outcome = account_services.user_change_by_staff(
        actor=admin1, user=peer.user, changes={"email": "new@test.example", "phone": "+63 917 555 0000"}, reason="r"
    )
    assert outcome.request.changes == {"email": "new@test.example", "phone": "+639175550000"}
    UserFactory(email="new@test.example")
    with pytest.raises(changes.ChangeRefused, match="already exists"):
        changes.change_approve(request_id=outcome.request.pk, approved_by=admin2, reason="ok")
    peer.user.refresh_from_db()
    assert (peer.user.email, peer.user.phone) == (PEER, "+639170000002")


def test_a_phone_change_waits_and_numbers_are_compared_normalised(world):
    peer, other, sender, admin1, admin2 = world
    one = logged_in(admin1)

    # Another account cannot take the peer's number, however it is written.
    for written in ("+639170000002", "+63 917 000 0002", "+63 (917) 000-0002"):
        taken = change_user(one, other.user, phone=written, reason="r")
        assert taken.status_code == 200
        assert "Another account has this phone number" in str(taken.context["adminform"].form.errors["phone"])
    assert not ChangeRequest.objects.exists()

    # The peer's own new number is only proposed, stored normalised.
    response = change_user(one, peer.user, phone="+63 (917) 555-0000", reason="new SIM")
    assert any("another Administrator must approve it" in m for m in page_messages(response))
    request = ChangeRequest.objects.get()
    assert request.changes == {"phone": "+639175550000"}
    peer.user.refresh_from_db()
    assert peer.user.phone == "+639170000002"
    assert_error(_send(sender, "+639175550000"), -1151, 404)

    # A transfer finds a number by the same normalisation.
    assert _send(sender, "+63 917 000-0002").status_code == 200
    assert_balance(peer.user, "PHP", "10")

    _decide(logged_in(admin2), request)
    peer.user.refresh_from_db()
    assert peer.user.phone == "+639175550000"
    assert _send(sender, "+63-917-555-0000").status_code == 200
    assert_balance(peer.user, "PHP", "20")
    assert_error(_send(sender, "+639170000002"), -1151, 404)
    assert_ledger_balanced()


def test_the_database_keeps_numbers_unique_normalised(world):
    _, other, *_ = world
    with pytest.raises(IntegrityError), transaction.atomic():
        User.objects.filter(pk=other.user.pk).update(phone="+63 (917) 000-0002")  # a raw write skips the services
    with pytest.raises(ValueError, match="Another account has this phone number"):
        account_services.user_create(email="third@test.example", phone="+63-917-000-0002")
    with pytest.raises(ValueError, match=r"E\.164"):
        account_services.user_create(email="fourth@test.example", phone="0917 000 0002")


def test_the_rule_lives_in_the_service(world):
    """Whoever calls it: the service checks the staff member and proposes, never applies, alone."""
    peer, other, _, admin1, _ = world
    support = staff_member(SUPPORT)
    with pytest.raises(account_services.StaffChangeRefused):
        account_services.user_change_by_staff(
            actor=support, user=peer.user, changes={"email": "x@test.example"}, reason="r"
        )
    with pytest.raises(account_services.StaffChangeRefused, match="on their own"):
        account_services.user_change_by_staff(
            actor=admin1, user=peer.user, changes={"email": "x@test.example", "base_token": "USDT"}, reason="r"
        )
    for field, value in (("is_virtual", True), ("enable_withdraw_whitelist", False)):
        if field == "enable_withdraw_whitelist":
            User.objects.filter(pk=other.user.pk).update(enable_withdraw_whitelist=True)
        outcome = account_services.user_change_by_staff(
            actor=admin1, user=other.user, changes={field: value}, reason="r"
        )
        assert not outcome.applied, field
        assert outcome.request.loosens == [field], field
        other.user.refresh_from_db()
        assert getattr(other.user, field) != value, field
    # Switching the whitelist on tightens a control: at once, audited.
    User.objects.filter(pk=other.user.pk).update(enable_withdraw_whitelist=False)
    ChangeRequest.objects.all().delete()
    outcome = account_services.user_change_by_staff(
        actor=admin1, user=other.user, changes={"enable_withdraw_whitelist": True}, reason="customer asked"
    )
    assert outcome.applied
    other.user.refresh_from_db()
    assert other.user.enable_withdraw_whitelist is True
    assert StaffAction.objects.filter(action="account.change", actor=admin1).exists()


# --- "Add user" under a master -------------------------------------------------------------------


def _add_user(client, **fields):
    data = {
        "email": "",
        "phone": "",
        "master": "",
        "password1": "Pw-for-tests-123",
        "password2": "Pw-for-tests-123",
        "reason": "ticket 12: new sub-account",
        "_save": "Save",
    }
    return client.post(reverse("admin:accounts_user_add"), {**data, **fields}, follow=True)


def test_an_account_added_under_a_master_joins_it_only_when_a_second_administrator_approves(world):
    _, other, _, admin1, admin2 = world
    master = other  # a customer with a key, whose family the new account would join
    response = _add_user(logged_in(admin1), email="joiner@test.example", master=str(master.user.pk))
    assert any("another Administrator must approve it" in m for m in page_messages(response)), page_messages(response)
    joiner = User.objects.get(email="joiner@test.example")
    assert joiner.master_id is None
    request = ChangeRequest.objects.get()
    assert (request.changes, request.object_id, request.proposed_by) == (
        {"master": master.user.pk},
        str(joiner.pk),
        admin1,
    )
    assert list(StaffAction.objects.order_by("id").values_list("action", flat=True)) == [
        "account.create",
        "account.propose",
    ]
    listed = master.client.get(SUB_LIST).json()
    assert "joiner@test.example" not in str(listed)

    own = _decide(logged_in(admin1), request)
    assert any("another Administrator must approve it" in m for m in page_messages(own))
    joiner.refresh_from_db()
    assert joiner.master_id is None

    _decide(logged_in(admin2), request)
    joiner.refresh_from_db()
    assert joiner.master_id == master.user.pk
    assert "joiner@test.example" in str(master.client.get(SUB_LIST).json())


def test_an_account_cannot_be_added_under_a_staff_or_sub_account(world):
    peer, _, _, admin1, admin2 = world
    sub = UserFactory(master=peer.user)
    for master in (admin2, sub):
        response = _add_user(logged_in(admin1), email="x@test.example", master=str(master.pk))
        assert response.status_code == 200
        assert "master" in response.context["adminform"].form.errors
    assert not User.objects.filter(email="x@test.example").exists()
    assert not ChangeRequest.objects.exists()
