"""Universal transfers and sub-to-master (issue 15, items 4 and 5): every direction inside a family,
never outside it; clientTranId once per family; amounts within the asset's precision; one
VIRTUAL_DISTRIBUTE posting whose sender is the source (a frozen sub-account cannot send)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.ledger.models import BusinessType, Posting
from accounts.models import ApiKeyType
from subaccounts.models import SubAccountTransfer
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.client import SignedClient
from tests.support.factories import ApiKeyFactory, UserFactory


def universal(family, **params):
    return family.master.client.post(h.UNIVERSAL, {"asset": "BTC", **params})


def test_master_to_sub_account(family):
    body = h.ok(universal(family, toEmail=family.sub2.user.email, amount="0.3", clientTranId="t-1"))
    assert body == {"clientTransferId": "t-1", "result": True}
    assert_balance(family.master.user, "BTC", "0.7")
    assert_balance(family.sub2.user, "BTC", "0.3")
    transfer = SubAccountTransfer.objects.get()
    assert (transfer.from_account_id, transfer.to_account_id) == (family.master.user.pk, family.sub2.user.pk)
    assert transfer.posting.kind == BusinessType.VIRTUAL_DISTRIBUTE
    assert transfer.status == "success"
    assert_ledger_balanced()


def test_sub_account_to_master(family):
    h.ok(universal(family, fromEmail=family.sub1.user.email, amount="0.2"))
    assert_balance(family.sub1.user, "BTC", "0.3")
    assert_balance(family.master.user, "BTC", "1.2")
    assert_ledger_balanced()


def test_sub_account_to_sub_account(family):
    h.ok(universal(family, fromEmail=family.sub1.user.email, toEmail=family.sub2.user.email, amount="0.5"))
    assert_balance(family.sub1.user, "BTC", "0")
    assert_balance(family.sub2.user, "BTC", "0.5")
    assert_balance(family.master.user, "BTC", "1")
    assert_ledger_balanced()


def test_the_master_named_by_its_email_is_not_a_sub_account(family):
    response = universal(family, fromEmail=family.master.user.email, toEmail=family.sub2.user.email, amount="0.1")
    assert_error(response, -1151, 404)


def test_a_service_made_client_tran_id_when_none_is_sent(family):
    body = h.ok(universal(family, toEmail=family.sub2.user.email, amount="0.1"))
    assert body["result"] is True
    assert len(body["clientTransferId"]) == 32
    assert SubAccountTransfer.objects.get().client_tran_id == body["clientTransferId"]


def test_at_least_one_email(family):
    assert_error(universal(family, amount="0.1"), -1025, 400, msg_contains="fromEmail")
    assert not SubAccountTransfer.objects.exists()


def test_not_to_the_same_account(family):
    email = family.sub1.user.email
    assert_error(universal(family, fromEmail=email, toEmail=email, amount="0.1"), -1025, 400)
    assert_balance(family.sub1.user, "BTC", "0.5")


@pytest.mark.parametrize("side", ["fromEmail", "toEmail"])
def test_never_another_masters_sub_account_nor_an_unrelated_user(family, other_family, side):
    stranger = UserFactory(email="stranger@test.example")
    for email in (other_family.sub1.user.email, other_family.master.user.email, stranger.email):
        assert_error(universal(family, **{side: email}, amount="0.1"), -1151, 404)
    assert not SubAccountTransfer.objects.exists()
    assert_balance(other_family.sub1.user, "BTC", "0.25")


def test_a_bad_amount_is_refused_before_any_email_is_looked_up(family, other_family):
    """Issue 25, finding 7: the same -1025 whoever the e-mail names (it was -1151 for any e-mail
    that is not one of the family's, and "must be positive" for one that is)."""
    for email in (family.sub2.user.email, other_family.sub1.user.email, "nobody@test.example"):
        response = universal(family, toEmail=email, amount="0")
        assert_error(response, -1025, 400, msg_contains="Parameter 'amount' is not valid: must be positive")
    assert not SubAccountTransfer.objects.exists()


def test_a_sub_account_cannot_call_universal_transfer_even_within_its_family(family):
    response = family.sub1.client.post(
        h.UNIVERSAL,
        {"fromEmail": family.sub1.user.email, "toEmail": family.sub2.user.email, "asset": "BTC", "amount": "0.1"},
    )
    assert_error(response, -1152, 401)
    assert_balance(family.sub1.user, "BTC", "0.5")


def test_a_repeated_client_tran_id_moves_nothing(family):
    h.ok(universal(family, toEmail=family.sub2.user.email, amount="0.1", clientTranId="once"))
    again = universal(family, toEmail=family.sub2.user.email, amount="0.1", clientTranId="once")
    assert_error(again, -1010, 400, msg_contains="clientTranId")
    other_direction = universal(family, fromEmail=family.sub1.user.email, amount="0.1", clientTranId="once")
    assert_error(other_direction, -1010, 400)
    assert_balance(family.sub2.user, "BTC", "0.1")
    assert SubAccountTransfer.objects.count() == 1
    assert_ledger_balanced()


def test_client_tran_id_is_unique_per_master_not_globally(family, other_family):
    h.ok(universal(family, toEmail=family.sub2.user.email, amount="0.1", clientTranId="shared"))
    h.ok(
        other_family.master.client.post(
            h.UNIVERSAL,
            {"toEmail": other_family.sub2.user.email, "asset": "BTC", "amount": "0.1", "clientTranId": "shared"},
        )
    )
    assert SubAccountTransfer.objects.count() == 2


def test_sub_to_master_shares_the_familys_client_tran_ids(family):
    h.ok(universal(family, toEmail=family.sub2.user.email, amount="0.1", clientTranId="fam-id"))
    response = family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1", "clientTranId": "fam-id"})
    assert_error(response, -1010, 400)
    assert_balance(family.sub1.user, "BTC", "0.5")


@pytest.mark.parametrize(
    ("amount", "code"), [("0", -1025), ("-1", -1025), ("0.000000001", -1025), ("abc", -1025), ("1e-3", -1025)]
)
def test_amount_positive_and_within_the_assets_precision(family, amount, code):
    assert_error(universal(family, toEmail=family.sub2.user.email, amount=amount), code, 400)
    assert not SubAccountTransfer.objects.exists()


def test_unknown_asset(family):
    response = family.master.client.post(
        h.UNIVERSAL, {"toEmail": family.sub2.user.email, "asset": "NOPE", "amount": "1"}
    )
    assert_error(response, -1025, 400, msg_contains="asset")


def test_asset_and_amount_required(family):
    assert_error(family.master.client.post(h.UNIVERSAL, {"toEmail": family.sub2.user.email, "amount": "1"}), -1105)
    assert_error(family.master.client.post(h.UNIVERSAL, {"toEmail": family.sub2.user.email, "asset": "BTC"}), -1105)


def test_a_key_without_the_assets_fund_type_is_refused(family):
    convert_only = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.CONVERT]))
    response = convert_only.post(h.UNIVERSAL, {"toEmail": family.sub2.user.email, "asset": "BTC", "amount": "0.1"})
    assert_error(response, -2019, 401)
    fiat_only = SignedClient.of(ApiKeyFactory(user=family.master.user, types=[ApiKeyType.FIAT]))
    h.ok(fiat_only.post(h.UNIVERSAL, {"toEmail": family.sub2.user.email, "asset": "PHP", "amount": "10"}))


def test_beyond_the_balance_is_a_recorded_failed_transfer(family):
    body = h.ok(universal(family, fromEmail=family.sub1.user.email, amount="0.6", clientTranId="short"))
    assert body == {"clientTransferId": "short", "result": False}
    failed = SubAccountTransfer.objects.get()
    assert failed.status == "failed"
    assert failed.posting is None
    assert_balance(family.sub1.user, "BTC", "0.5")
    assert_balance(family.master.user, "BTC", "1")
    assert_error(universal(family, fromEmail=family.sub1.user.email, amount="0.1", clientTranId="short"), -1010)
    assert_ledger_balanced()


def test_a_frozen_sub_account_cannot_send(family):
    family.sub1.user.is_frozen = True
    family.sub1.user.save()
    for target in ({}, {"toEmail": family.sub2.user.email}):
        response = universal(family, fromEmail=family.sub1.user.email, amount="0.1", **target)
        assert_error(response, -1152, 401)
    assert_balance(family.sub1.user, "BTC", "0.5")
    assert not SubAccountTransfer.objects.exists()
    assert_ledger_balanced()


def test_a_frozen_sub_account_receives_nothing(family):
    family.sub2.user.is_frozen = True
    family.sub2.user.save()
    assert_error(universal(family, toEmail=family.sub2.user.email, amount="0.1"), -1152, 401)
    assert_balance(family.master.user, "BTC", "1")


def test_a_sub_account_barred_from_withdrawing_cannot_send(family):
    family.sub1.user.can_withdraw = False
    family.sub1.user.save()
    assert_error(universal(family, fromEmail=family.sub1.user.email, amount="0.1"), -1152, 401)


def test_one_posting_per_transfer(family):
    before = Posting.objects.count()
    h.ok(universal(family, toEmail=family.sub2.user.email, amount="0.1"))
    assert Posting.objects.count() == before + 1
    posting = Posting.objects.latest("id")
    assert posting.kind == BusinessType.VIRTUAL_DISTRIBUTE
    moved = {(e.account_id, e.side * e.amount) for e in posting.entries.all()}
    assert moved == {(family.master.user.pk, Decimal("-0.1")), (family.sub2.user.pk, Decimal("0.1"))}


# --- sub-to-master ---------------------------------------------------------------------------


def test_sub_to_master(family):
    body = h.ok(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.2", "clientTranId": "up-1"}))
    assert body == {"clientTransferId": "up-1", "result": True}
    assert_balance(family.sub1.user, "BTC", "0.3")
    assert_balance(family.master.user, "BTC", "1.2")
    transfer = SubAccountTransfer.objects.get()
    assert transfer.kind == "SUB_TO_MASTER"
    assert transfer.master_id == family.master.user.pk
    assert_ledger_balanced()


def test_sub_to_master_without_client_tran_id(family):
    body = h.ok(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.2"}))
    assert body["result"] is True
    assert body["clientTransferId"]


def test_sub_to_master_repeat_moves_nothing(family):
    h.ok(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1", "clientTranId": "u"}))
    assert_error(
        family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1", "clientTranId": "u"}), -1010
    )
    assert_balance(family.sub1.user, "BTC", "0.4")
    assert_ledger_balanced()


def test_sub_to_master_beyond_the_balance(family):
    body = h.ok(family.sub2.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1"}))
    assert body["result"] is False
    assert_balance(family.sub2.user, "BTC", "0")
    assert_ledger_balanced()


@pytest.mark.parametrize("amount", ["0", "-0.1", "0.123456789"])
def test_sub_to_master_amount(family, amount):
    assert_error(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": amount}), -1025, 400)


def test_sub_to_master_unknown_asset(family):
    assert_error(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "NOPE", "amount": "1"}), -1025, 400)


def test_a_non_virtual_sub_account_may_send_to_its_master_too(family):
    from tests.support.factories import customer

    linked = customer(email="linked@test.example", master=family.master.user, funding={"BTC": "0.1"})
    h.ok(linked.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.1"}))
    assert_balance(family.master.user, "BTC", "1.1")
