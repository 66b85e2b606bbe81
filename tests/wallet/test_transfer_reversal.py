"""Reversing a P2P transfer (issue 34, finding 2): a reversal takes money out of a customer's
account, so above TRANSFER_REVERSAL_FOUR_EYES_ABOVE (0 by default: every one) one Administrator
asks for it in the admin (no money moves) and a second one, never the first, posts it; each step
needs a reason and leaves its audit row (written by wallet.transfers.services). The customers see
it as what it is: the transfer record says it was reversed and names the reversal's posting, which
is an OTHERS row in their transaction history and an OTHERS balanceUpdate on their stream."""

from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction
from django.urls import reverse

from accounts.ledger.models import BusinessType, Posting
from exchange.backoffice.models import StaffAction
from exchange.backoffice.services import ReasonRequired
from tests.support.assertions import assert_balance, assert_ledger_balanced
from tests.support.factories import UserFactory, customer
from tests.support.staff import ADMINISTRATOR, TREASURY, logged_in, staff_member
from tests.support.streams import connect
from wallet.models import Transfer
from wallet.transfers import services as transfers

V4 = "/openapi/transfer/v4/transfers"
V3 = "/openapi/transfer/v3/transfers"
HISTORY = "/openapi/v1/asset/transaction/history"


@pytest.fixture(autouse=True)
def _raised_limits(settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000


def _send(sender, recipient, amount: str) -> Transfer:
    response = sender.client.post(V4, {"account": "PHP", "target_address": recipient.email, "amount": amount})
    assert response.status_code == 200, response.content
    return Transfer.objects.get(pk=int(response.json()["transfer"]["id"]))


def _reverse_url(transfer: Transfer) -> str:
    return reverse("admin:wallet_transfer_reverse", args=[transfer.pk])


def _post(client, transfer: Transfer, reason: str, decision: str = "reverse"):
    return client.post(_reverse_url(transfer), {"reason": reason, "decision": decision}, follow=True)


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def _audit(transfer: Transfer) -> list[tuple[str, int, str]]:
    rows = StaffAction.objects.filter(object_type="wallet.transfer", object_id=str(transfer.pk)).order_by("id")
    return list(rows.values_list("action", "actor_id", "reason"))


# --- four eyes through the admin -----------------------------------------------------------------


@pytest.mark.django_db
def test_one_administrator_only_asks_a_second_one_reverses():
    """The reproduction: 100,000 PHP reversed by one Administrator alone. Now the first one's click
    moves nothing, the same one cannot confirm, Treasury cannot at all, and a second Administrator's
    confirmation posts it once."""
    alice, bob = customer(funding={"PHP": "150000"}), customer()
    transfer = _send(alice, bob.user, "100000")
    first, second = staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)
    postings = Posting.objects.count()

    page = logged_in(first).get(_reverse_url(transfer))
    assert b"takes two Administrators" in page.content
    asked = _post(logged_in(first), transfer, "customer says wrong recipient, ticket 77")
    assert any("Another Administrator must confirm it" in m for m in _messages(asked)), _messages(asked)
    transfer.refresh_from_db()
    assert (transfer.reversal_requested_by, transfer.reversal_posting) == (first, None)
    assert transfer.reversal_reason == "customer says wrong recipient, ticket 77"
    assert Posting.objects.count() == postings  # no money moved
    assert_balance(bob.user, "PHP", "100000")

    # The one who asked cannot confirm: no button, and the post is refused.
    page = logged_in(first).get(_reverse_url(transfer))
    assert b'id="confirm-reversal"' not in page.content
    again = _post(logged_in(first), transfer, "me again")
    assert any("another Administrator must confirm it" in m for m in _messages(again)), _messages(again)
    assert Posting.objects.count() == postings

    # Treasury may not reverse; nor may anyone without a reason.
    assert logged_in(staff_member(TREASURY)).post(_reverse_url(transfer), {"reason": "x"}).status_code == 403
    no_reason = logged_in(second).post(_reverse_url(transfer), {"reason": "  "})
    assert no_reason.status_code == 200  # the form again
    assert Posting.objects.count() == postings

    page = logged_in(second).get(_reverse_url(transfer))
    assert b'id="confirm-reversal"' in page.content
    done = _post(logged_in(second), transfer, "checked with the recipient")
    assert any("reversed by a new posting" in m for m in _messages(done)), _messages(done)
    transfer.refresh_from_db()
    assert (transfer.reversal_requested_by, transfer.reversed_by) == (first, second)
    reversal = transfer.reversal_posting
    assert reversal.kind == BusinessType.OTHERS
    assert reversal.actor_id == second.pk
    assert "ticket 77" in reversal.memo
    assert "checked with the recipient" in reversal.memo
    assert_balance(alice.user, "PHP", "150000")
    assert_balance(bob.user, "PHP", "0")
    assert _audit(transfer) == [
        ("transfer.reverse_request", first.pk, "customer says wrong recipient, ticket 77"),
        ("transfer.reverse", second.pk, "checked with the recipient"),
    ]  # the refused attempts left no record

    once_more = _post(logged_in(staff_member(ADMINISTRATOR)), transfer, "again")
    assert any("already reversed" in m for m in _messages(once_more))
    assert Posting.objects.count() == postings + 1
    assert_ledger_balanced()


@pytest.mark.django_db
def test_a_request_is_cancelled_with_a_reason_and_nothing_moves():
    alice, bob = customer(funding={"PHP": "5000"}), customer()
    transfer = _send(alice, bob.user, "1000")
    first, second = staff_member(ADMINISTRATOR), staff_member(ADMINISTRATOR)
    _post(logged_in(first), transfer, "looks wrong")
    cancelled = _post(logged_in(first), transfer, "the customer found it", decision="cancel")
    assert any("Reversal request cancelled" in m for m in _messages(cancelled)), _messages(cancelled)
    transfer.refresh_from_db()
    assert (transfer.reversal_requested_by, transfer.reversal_posting, transfer.reversal_reason) == (None, None, "")
    # A later click is a new request, not a confirmation of the cancelled one.
    _post(logged_in(second), transfer, "asked again")
    transfer.refresh_from_db()
    assert (transfer.reversal_requested_by, transfer.reversal_posting) == (second, None)
    assert_balance(bob.user, "PHP", "1000")
    assert [action for action, _, _ in _audit(transfer)] == [
        "transfer.reverse_request",
        "transfer.reverse_cancel",
        "transfer.reverse_request",
    ]


@pytest.mark.django_db
def test_below_the_threshold_one_administrator_reverses_alone_with_a_reason(settings):
    settings.TRANSFER_REVERSAL_FOUR_EYES_ABOVE = Decimal("5000")  # PHP
    alice, bob = customer(funding={"PHP": "20000"}), customer()
    small, large = _send(alice, bob.user, "1000"), _send(alice, bob.user, "10000")
    admin = staff_member(ADMINISTRATOR)

    done = _post(logged_in(admin), small, "duplicate payment")
    assert any("reversed by a new posting" in m for m in _messages(done)), _messages(done)
    small.refresh_from_db()
    assert (small.reversal_requested_by, small.reversed_by) == (None, admin)
    assert _audit(small) == [("transfer.reverse", admin.pk, "duplicate payment")]

    _post(logged_in(admin), large, "duplicate payment")
    large.refresh_from_db()
    assert (large.reversal_requested_by, large.reversal_posting) == (admin, None)  # above it: waits
    assert_balance(bob.user, "PHP", "10000")
    assert_ledger_balanced()


@pytest.mark.django_db
def test_the_service_holds_the_rule_whoever_calls_it():
    alice, bob = customer(funding={"PHP": "5000"}), customer()
    transfer = _send(alice, bob.user, "1000")
    admin = staff_member(ADMINISTRATOR)
    with pytest.raises(ReasonRequired):
        transfers.transfer_reverse(transfer=transfer, reversed_by=admin, reason=" ")
    with pytest.raises(transfers.ReversalRefused, match="Only an Administrator"):
        transfers.transfer_reverse(transfer=transfer, reversed_by=staff_member(TREASURY), reason="x")
    with pytest.raises(transfers.ReversalRefused, match="Only an Administrator"):
        transfers.transfer_reverse(transfer=transfer, reversed_by=UserFactory(), reason="x")
    transfers.transfer_reverse(transfer=transfer, reversed_by=admin, reason="asked")
    with pytest.raises(transfers.ReversalRefused, match="another Administrator"):
        transfers.transfer_reverse(transfer=transfer, reversed_by=admin, reason="confirmed by myself")
    # And the database itself: the one who asked is never the one who reversed.
    with pytest.raises(IntegrityError), transaction.atomic():
        Transfer.objects.filter(pk=transfer.pk).update(reversed_by=admin)
    assert_balance(bob.user, "PHP", "1000")


# --- what the customers see ---------------------------------------------------------------------


def _reverse_with_four_eyes(transfer: Transfer) -> Transfer:
    _post(logged_in(staff_member(ADMINISTRATOR)), transfer, "wrong recipient")
    _post(logged_in(staff_member(ADMINISTRATOR)), transfer, "confirmed")
    transfer.refresh_from_db()
    assert transfer.reversal_posting_id is not None
    return transfer


@pytest.mark.django_db
def test_the_transfer_records_and_the_histories_show_the_reversal():
    alice, bob = customer(funding={"PHP": "5000"}), customer()
    transfer = _send(alice, bob.user, "1000")
    untouched = _send(alice, bob.user, "10")
    transfer = _reverse_with_four_eyes(transfer)
    reversal = str(transfer.reversal_posting_id)

    for viewer in (alice, bob):
        record = viewer.client.get(f"{V3}/{transfer.pk}").json()["transfer"]
        assert record["status"] == "success"  # the transfer happened; the reversal is another posting
        assert (record["reversed"], record["reversal_payment"]) == (True, reversal)
        assert record["reversed_at"].endswith("Z")
        listed = {t["id"]: t for t in viewer.client.get(V3).json()["transfers"]}
        assert listed[str(transfer.pk)]["reversal_payment"] == reversal
        assert not {"reversed", "reversal_payment", "reversed_at"} & set(listed[str(untouched.pk)])

    def rows(viewer) -> dict[str, dict]:
        found = viewer.client.get(HISTORY, {"tokenId": "PHP"}).json()["transactions"]
        return {row["txId"]: row for row in found}

    bob_rows, alice_rows = rows(bob), rows(alice)
    assert (bob_rows[reversal]["bizSubject"], bob_rows[reversal]["changed"]) == ("OTHERS", "-1000.00")
    assert (alice_rows[reversal]["bizSubject"], alice_rows[reversal]["changed"]) == ("OTHERS", "1000.00")
    assert bob_rows[str(transfer.posting_id)]["bizSubject"] == "P2P_TRANSFER"  # the original stays


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_streams_show_the_reversal_as_its_own_business_type():
    alice, bob = await sync_to_async(customer)(funding={"PHP": "5000"}), await sync_to_async(customer)()
    transfer = await sync_to_async(_send)(alice, bob.user, "1000")
    streams = {"alice": await connect(alice.user), "bob": await connect(bob.user)}
    transfer = await sync_to_async(_reverse_with_four_eyes)(transfer)
    for name, delta, after in (("bob", "-1000.00", "0.00"), ("alice", "1000.00", "5000.00")):
        update = await streams[name].receive_json_from(timeout=5)
        position = await streams[name].receive_json_from(timeout=5)
        assert update["e"] == "balanceUpdate"
        assert (update["a"], update["d"], update["BS"]) == ("PHP", delta, "OTHERS")
        assert position["B"] == [{"a": "PHP", "f": after, "l": "0.00"}]
    for ws in streams.values():
        await ws.disconnect()
