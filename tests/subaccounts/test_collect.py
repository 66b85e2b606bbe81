"""Fund collection (issue 15, item 9): the collect call creates a task in status INIT (once per
clientRequestId; -10324 while another task of the master is INIT, held by a partial unique
constraint under concurrent requests); a task moves every sub-account's free balances, all assets,
to the master in one VIRTUAL_DISTRIBUTE posting per sub-account and ends SUCCESS, PARTIAL_SUCCESS or
FAILED with the reasons in `comment`; run twice or again after a crash it collects each sub-account
once; get-fund-record pages the master's tasks; nobody outside the family sees or moves them. The
last part kills a real Celery worker (SIGKILL) in the middle of a collection."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from accounts import services as account_services
from accounts.ledger.models import BusinessType, Posting
from accounts.models import ApiKeyType, Balance, User
from exchange.api import ratelimit
from exchange.api.models import UntimedSignature
from subaccounts import collection as collection_service
from subaccounts.models import (
    CollectionStatus,
    FundCollection,
    FundCollectionOutcome,
    OutcomeStatus,
    SubAccountTransfer,
)
from subaccounts.tasks import fund_collection_task
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.client import SignedClient, hmac_hex, now_ms
from tests.support.factories import ApiKeyFactory, AssetFactory, customer, fund
from tests.support.stack import (
    CRASH_DB_NAME,
    CRASH_REDIS_DB,
    PYTHON,
    ROOT,
    Proc,
    free_port,
    manage,
    private_services,
    process,
    requires_services,
    stack_env,
    wait_for_port,
)
from tests.support.staff import logged_in, staff_in

COLLECT = "/openapi/v1/fund-collect/collect-from-sub-account"
RECORDS = "/openapi/v1/fund-collect/get-fund-record"


@pytest.fixture
def rich_family(assets) -> h.Family:
    """sub1 holds BTC and USDT, sub2 PHP and USDT, the master BTC and PHP."""
    family = h.family_of("coll", master_funding={"BTC": "1", "PHP": "10000"}, sub_funding={"BTC": "0.5"})
    fund(family.sub1.user, "USDT", "12.5")
    fund(family.sub2.user, "PHP", "300")
    fund(family.sub2.user, "USDT", "7")
    return family


def collect(who: h.Customer, request_id: str, **params):
    return who.client.post(COLLECT, {"clientRequestId": request_id, **params})


def records(who: h.Customer, **params) -> list:
    return h.ok(who.client.get(RECORDS, params))


def collect_now(captured, who, request_id: str, **params) -> dict:
    """The collect call with its task run once the request's transaction commits (the eager mode
    runs it in-process; on_commit callbacks of the test's transaction run when the block exits)."""
    with captured(execute=True):
        body = h.ok(collect(who, request_id, **params))
    return body


def free(user: User, code: str) -> Decimal:
    row = Balance.objects.filter(account=user, asset__code=code).first()
    return row.free if row else Decimal(0)


def family_totals(family: h.Family) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for member in (family.master, family.sub1, family.sub2):
        for code, amount in Balance.objects.filter(account=member.user).values_list("asset__code", "free"):
            totals[code] = totals.get(code, Decimal(0)) + amount
    return totals


def postings_of(collection: FundCollection) -> list[str]:
    return list(
        Posting.objects.filter(reference__startswith=f"fund-collect:{collection.pk}:")
        .order_by("reference")
        .values_list("reference", flat=True)
    )


# --- the collect call and the task ------------------------------------------------------------------


def test_collect_answers_init_and_the_task_moves_every_free_balance_to_the_master(
    rich_family, django_capture_on_commit_callbacks
):
    family = rich_family
    before = family_totals(family)
    body = collect_now(django_capture_on_commit_callbacks, family.master, "c-1", remark="1234")
    assert body == {"clientRequestId": "c-1", "status": "INIT", "comment": ""}
    collection = FundCollection.objects.get()
    assert (collection.status, collection.comment, collection.remark, collection.attempts) == ("SUCCESS", "", "1234", 1)
    assert collection.finished_at is not None
    for sub in (family.sub1, family.sub2):
        for code in ("BTC", "PHP", "USDT"):
            assert_balance(sub.user, code, "0")
    assert family_totals(family) == before  # the family's money, now all the master's
    assert free(family.master.user, "BTC") == before["BTC"]
    assert free(family.master.user, "USDT") == Decimal("19.5")
    assert free(family.master.user, "PHP") == Decimal("10300")
    # One posting per sub-account, all its assets in it, with the outcome row written with it.
    assert postings_of(collection) == sorted(
        f"fund-collect:{collection.pk}:{sub.user.pk}" for sub in (family.sub1, family.sub2)
    )
    for sub, assets_moved in ((family.sub1, {"BTC", "USDT"}), (family.sub2, {"PHP", "USDT"})):
        outcome = FundCollectionOutcome.objects.get(collection=collection, sub=sub.user)
        assert (outcome.status, outcome.reason) == (OutcomeStatus.COLLECTED, "")
        assert outcome.posting.kind == BusinessType.VIRTUAL_DISTRIBUTE
        assert {e.asset.code for e in outcome.posting.entries.all()} == assets_moved
    assert records(family.master) == [{"clientRequestId": "c-1", "comment": "", "status": "SUCCESS"}]
    assert_ledger_balanced()


def test_a_frozen_sub_account_makes_it_partial_success_with_the_reason(rich_family, django_capture_on_commit_callbacks):
    family = rich_family
    account_services.user_set_frozen(user=family.sub2.user, frozen=True)
    collect_now(django_capture_on_commit_callbacks, family.master, "c-frozen")
    collection = FundCollection.objects.get()
    assert collection.status == CollectionStatus.PARTIAL_SUCCESS
    assert collection.comment == f"Not collected from 1 of 2 sub-accounts: {family.sub2.user.email} (frozen)."
    assert_balance(family.sub1.user, "BTC", "0")
    assert_balance(family.sub2.user, "PHP", "300")  # untouched
    assert_balance(family.sub2.user, "USDT", "7")
    assert_balance(family.master.user, "USDT", "12.5")
    outcome = FundCollectionOutcome.objects.get(collection=collection, sub=family.sub2.user)
    assert (outcome.status, outcome.reason, outcome.posting) == (OutcomeStatus.REFUSED, "frozen", None)
    assert records(family.master) == [
        {"clientRequestId": "c-frozen", "comment": collection.comment, "status": "PARTIAL_SUCCESS"}
    ]
    assert_ledger_balanced()


def test_nothing_collectable_is_failed(family, django_capture_on_commit_callbacks):
    """sub1 (the only one holding money) is barred from sending, sub2 is empty: FAILED."""
    sub1 = family.sub1.user
    sub1.can_withdraw = False
    sub1.save(update_fields=["can_withdraw"])
    collect_now(django_capture_on_commit_callbacks, family.master, "c-none")
    collection = FundCollection.objects.get()
    assert collection.status == CollectionStatus.FAILED
    assert collection.comment == f"Not collected from 1 of 2 sub-accounts: {sub1.email} (barred from sending funds)."
    assert FundCollectionOutcome.objects.get(collection=collection, sub=family.sub2.user).status == "EMPTY"
    assert_balance(sub1, "BTC", "0.5")
    assert postings_of(collection) == []
    assert_ledger_balanced()


def test_a_deactivated_sub_account_and_a_frozen_master(family, django_capture_on_commit_callbacks):
    sub1 = family.sub1.user
    sub1.is_active = False
    sub1.save(update_fields=["is_active"])
    collect_now(django_capture_on_commit_callbacks, family.master, "c-inactive")
    assert FundCollection.objects.get().comment.endswith(f"{sub1.email} (deactivated).")
    # A master frozen after its collect call: its task collects nothing.
    sub1.is_active = True
    sub1.save(update_fields=["is_active"])
    with django_capture_on_commit_callbacks(execute=False):
        h.ok(collect(family.master, "c-master-frozen"))
    account_services.user_set_frozen(user=family.master.user, frozen=True)
    collection = collection_service.fund_collection_run(
        collection_id=FundCollection.objects.get(client_request_id="c-master-frozen").pk
    )
    assert collection.status == CollectionStatus.FAILED
    assert "the master account is frozen or deactivated" in collection.comment
    assert_balance(sub1, "BTC", "0.5")
    assert_ledger_balanced()


def test_a_freeze_the_check_missed_is_refused_by_the_ledger_under_its_lock(
    family, monkeypatch, django_capture_on_commit_callbacks
):
    """The sub-account is frozen after the task checked it (here: the check is made to miss it):
    the posting's sender check on the ledger's row refuses it, nothing moves."""
    account_services.user_set_frozen(user=family.sub1.user, frozen=True)
    monkeypatch.setattr(collection_service, "_why_not_collectable", lambda master, sub: "")
    collect_now(django_capture_on_commit_callbacks, family.master, "c-late-freeze")
    collection = FundCollection.objects.get()
    assert collection.status == CollectionStatus.FAILED
    assert "(may not send funds (frozen or barred))" in collection.comment
    assert_balance(family.sub1.user, "BTC", "0.5")
    assert postings_of(collection) == []
    assert_ledger_balanced()


def test_parameters_in_the_form_body_as_the_connector_sends_them(family, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = family.master.client.post(COLLECT, {}, body={"clientRequestId": "in-body", "remark": "7"})
    assert h.ok(response) == {"clientRequestId": "in-body", "status": "INIT", "comment": ""}
    assert FundCollection.objects.get().remark == "7"
    assert records(family.master)[0]["status"] == "SUCCESS"


def test_a_family_with_nothing_to_collect_succeeds(family, django_capture_on_commit_callbacks):
    h.ok(family.master.client.post(h.UNIVERSAL, {"fromEmail": family.sub1.user.email, "asset": "BTC", "amount": "0.5"}))
    collect_now(django_capture_on_commit_callbacks, family.master, "c-empty")
    collection = FundCollection.objects.get()
    assert (collection.status, collection.comment) == ("SUCCESS", "")
    assert set(collection.outcomes.values_list("status", flat=True)) == {"EMPTY"}
    assert_ledger_balanced()


def test_a_master_without_sub_accounts_gets_an_empty_success(assets, django_capture_on_commit_callbacks):
    loner = customer(email="loner@test.example", funding={"BTC": "1"})
    collect_now(django_capture_on_commit_callbacks, loner, "c-loner")
    assert records(loner) == [{"clientRequestId": "c-loner", "comment": "", "status": "SUCCESS"}]
    assert_balance(loner.user, "BTC", "1")


# --- the INIT rule and clientRequestId --------------------------------------------------------------


def test_a_collect_while_one_is_init_is_request_repeated(family):
    # The test's transaction never commits: the first task stays INIT.
    assert h.ok(collect(family.master, "c-a"))["status"] == "INIT"
    assert_error(collect(family.master, "c-b"), -10324, 400, msg_contains="Request repeated")
    assert list(FundCollection.objects.values_list("client_request_id", flat=True)) == ["c-a"]
    # Once it ran, the master may collect again.
    collection_service.fund_collection_run(collection_id=FundCollection.objects.get().pk)
    assert h.ok(collect(family.master, "c-b"))["status"] == "INIT"
    # Another master's INIT task is no obstacle.
    other = h.family_of("coll-other", master_funding={}, sub_funding={"BTC": "0.1"})
    assert h.ok(collect(other.master, "c-b"))["status"] == "INIT"  # the same id in another family


def test_a_repeated_client_request_id_is_a_duplicate(family):
    h.ok(collect(family.master, "dup"))
    # While it is INIT, and after it ran: the id is spent (-1010), not "repeated".
    assert_error(collect(family.master, "dup"), -1010, 400, msg_contains="Duplicate clientRequestId")
    collection_service.fund_collection_run(collection_id=FundCollection.objects.get().pk)
    assert_error(collect(family.master, "dup"), -1010, 400, msg_contains="Duplicate clientRequestId")
    assert FundCollection.objects.count() == 1


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, -1105),
        ({"clientRequestId": "x" * 201}, -1025),
        ({"clientRequestId": "ok", "remark": "9" * 256}, -1025),
        ({"clientRequestId": "bad\x01id"}, -1025),
    ],
    ids=["missing", "201-characters", "remark-too-long", "control-character"],
)
def test_collect_parameters(family, params, code):
    assert_error(family.master.client.post(COLLECT, params), code, 400)
    assert not FundCollection.objects.exists()


def test_a_200_character_client_request_id_and_any_remark_text(family):
    long_id = "r" * 200
    assert h.ok(collect(family.master, long_id, remark="20250423"))["clientRequestId"] == long_id
    assert FundCollection.objects.get().remark == "20250423"


def test_the_call_is_signed_and_needs_a_fund_moving_key(family):
    master = family.master
    # Without a timestamp too (issue 25: it is optional here), the signature is required.
    assert_error(master.client.post(COLLECT, {"clientRequestId": "u"}, signed=False), -1022, 401)
    unsigned = master.client.post(COLLECT, {"clientRequestId": "u", "timestamp": now_ms()}, signed=False)
    assert_error(unsigned, -1022, 401)
    assert_error(master.client.post(COLLECT, {"clientRequestId": "u"}, signature="0" * 64), -1022, 401)
    read_only = SignedClient.of(ApiKeyFactory(user=master.user, types=[ApiKeyType.READ_ONLY]))
    assert_error(read_only.post(COLLECT, {"clientRequestId": "u"}), -1020, 401)
    crypto_only = SignedClient.of(ApiKeyFactory(user=master.user, types=[ApiKeyType.CRYPTO_WALLET]))
    assert_error(crypto_only.post(COLLECT, {"clientRequestId": "u"}), -2019, 401)
    assert not FundCollection.objects.exists()
    assert h.ok(read_only.get(RECORDS)) == []  # reading the records is fine with a read-only key


# --- without a timestamp (issue 25: the spec lists none; the Postman collection sends none) ---------


def untimed(who: h.Customer, params: dict, *, secret: str | None = None, signature: str | None = None):
    """The collect call as the Postman collection sends it: its parameters and the signature over
    them as typed, no timestamp, no recvWindow."""
    text = "&".join(f"{name}={value}" for name, value in params.items())
    signature = signature or hmac_hex(secret or who.secret, text)
    return who.client.client.generic(
        "POST",
        f"{COLLECT}?{text}&signature={signature}",
        content_type="application/x-www-form-urlencoded",
        headers={"X-SERVICE-APIKEY": who.api_key.key},
    )


def test_without_a_timestamp_the_collect_call_is_accepted_and_collects(family, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        answer = h.ok(untimed(family.master, {"clientRequestId": "no-ts", "remark": ""}))
    assert answer == {"clientRequestId": "no-ts", "status": "INIT", "comment": ""}
    assert FundCollection.objects.get().status == CollectionStatus.SUCCESS
    assert_balance(family.sub1.user, "BTC", 0)
    assert_balance(family.master.user, "BTC", "1.5")
    assert_ledger_balanced()


def test_without_a_timestamp_a_bad_or_missing_signature_is_refused(family):
    params = {"clientRequestId": "forged", "remark": ""}
    assert_error(untimed(family.master, params, signature="0" * 64), -1022, 401, msg_contains="ignature")
    assert_error(untimed(family.master, params, secret="not-the-secret"), -1022, 401)
    # The signature of other parameters (a captured request with its id changed).
    other = hmac_hex(family.master.secret, "clientRequestId=captured&remark=")
    assert_error(untimed(family.master, params, signature=other), -1022, 401)
    no_signature = family.master.client.client.generic(
        "POST", f"{COLLECT}?clientRequestId=forged", headers={"X-SERVICE-APIKEY": family.master.api_key.key}
    )
    assert_error(no_signature, -1022, 401)
    assert not FundCollection.objects.exists()


def test_a_replayed_untimed_collect_moves_money_once(family, django_capture_on_commit_callbacks):
    """The same signed request again: refused by the replay memory (-1022), also with the rate-limit
    storage emptied (a Redis flush: the untimed signature is spent in the database, issue 34); with
    that record gone too, by the clientRequestId's unique constraint (-1010). One task, one posting."""
    params = {"clientRequestId": "once", "remark": ""}
    with django_capture_on_commit_callbacks(execute=True):
        h.ok(untimed(family.master, params))
    fund(family.sub1.user, "BTC", "0.25")  # something a second collection would move
    assert_error(untimed(family.master, params), -1022, 401, msg_contains="replay")
    ratelimit.counters().reset()
    assert_error(untimed(family.master, params), -1022, 401, msg_contains="replay")
    UntimedSignature.objects.all().delete()
    ratelimit.counters().reset()
    with django_capture_on_commit_callbacks(execute=True):
        assert_error(untimed(family.master, params), -1010, 400, msg_contains="Duplicate clientRequestId")
    assert FundCollection.objects.count() == 1
    assert_balance(family.sub1.user, "BTC", "0.25")
    assert Posting.objects.filter(reference__startswith="fund-collect:").count() == 1
    assert_ledger_balanced()


def test_a_timestamp_sent_is_still_checked_and_other_endpoints_still_need_one(family):
    stale = family.master.client.post(COLLECT, {"clientRequestId": "stale"}, timestamp=now_ms() - 60_000)
    assert_error(stale, -1021, 400)
    assert not FundCollection.objects.exists()
    for path in (RECORDS, h.UNIVERSAL):
        response = family.master.client.post(path, {"asset": "BTC", "amount": "1"}, timestamp=False)
        if path == RECORDS:
            response = family.master.client.get(path, timestamp=False)
        assert_error(response, -1105, 400, msg_contains="timestamp")


# --- who may call ------------------------------------------------------------------------------------


def test_a_sub_accounts_key_is_refused_on_both_endpoints(family):
    assert_error(collect(family.sub1, "from-sub"), -1152, 401)
    assert_error(family.sub1.client.get(RECORDS), -1152, 401)
    assert not FundCollection.objects.exists()


def test_another_master_never_sees_nor_collects_this_family(family, other_family, django_capture_on_commit_callbacks):
    collect_now(django_capture_on_commit_callbacks, family.master, "mine")
    assert records(other_family.master) == []
    assert records(other_family.master, clientRequestId="mine") == []
    collect_now(django_capture_on_commit_callbacks, other_family.master, "theirs")
    assert_balance(other_family.sub1.user, "BTC", "0")
    assert_balance(other_family.master.user, "BTC", "1.25")
    assert_balance(family.master.user, "BTC", "1.5")  # this family's collection only
    assert records(family.master) == [{"clientRequestId": "mine", "comment": "", "status": "SUCCESS"}]
    theirs = FundCollection.objects.get(client_request_id="theirs")
    assert set(theirs.outcomes.values_list("sub_id", flat=True)) == {
        other_family.sub1.user.pk,
        other_family.sub2.user.pk,
    }
    # An unrelated customer (no sub-accounts) collects nothing of anyone's.
    stranger = customer(email="stranger@test.example")
    collect_now(django_capture_on_commit_callbacks, stranger, "stranger")
    assert not FundCollectionOutcome.objects.filter(collection__client_request_id="stranger").exists()
    assert_ledger_balanced()


def test_a_frozen_masters_key_is_refused(family):
    account_services.user_set_frozen(user=family.master.user, frozen=True)
    assert_error(collect(family.master, "frozen-master"), -2015, 401)


# --- get-fund-record ---------------------------------------------------------------------------------


def test_records_page_ascending_with_a_filter(family):
    for i in range(5):
        h.ok(collect(family.master, f"r-{i}"))
        collection_service.fund_collection_run(collection_id=FundCollection.objects.get(client_request_id=f"r-{i}").pk)
    ids = [r["clientRequestId"] for r in records(family.master)]
    assert ids == [f"r-{i}" for i in range(5)]
    assert [r["clientRequestId"] for r in records(family.master, page=2, size=2)] == ["r-2", "r-3"]
    assert [r["clientRequestId"] for r in records(family.master, page=3, size=2)] == ["r-4"]
    assert records(family.master, page=4, size=2) == []
    assert records(family.master, clientRequestId="r-3") == [
        {"clientRequestId": "r-3", "comment": "", "status": "SUCCESS"}
    ]
    assert records(family.master, clientRequestId="nope") == []
    assert list(records(family.master)[0]) == ["clientRequestId", "comment", "status"]


def test_records_size_default_and_bounds(family):
    FundCollection.objects.bulk_create(
        FundCollection(
            master=family.master.user,
            client_request_id=f"bulk-{i:03}",
            status=CollectionStatus.SUCCESS,
            created_at=timezone.now(),
            updated_at=timezone.now(),
        )
        for i in range(105)
    )
    assert len(records(family.master)) == 100
    assert [r["clientRequestId"] for r in records(family.master, page=2)] == [f"bulk-{i:03}" for i in range(100, 105)]
    assert len(records(family.master, size=100)) == 100
    for bad in ({"size": 101}, {"size": 0}, {"page": 0}, {"page": "x"}):
        assert_error(family.master.client.get(RECORDS, bad), -1025, 400)


# --- the admin ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["Administrator", "Support"])
def test_the_admin_shows_tasks_with_their_outcomes_read_only(
    rich_family, make_user, role, django_capture_on_commit_callbacks
):
    account_services.user_set_frozen(user=rich_family.sub2.user, frozen=True)
    collect_now(django_capture_on_commit_callbacks, rich_family.master, "admin-view")
    collection = FundCollection.objects.get()
    staff = logged_in(staff_in(make_user, role))
    listing = staff.get(reverse("admin:subaccounts_fundcollection_changelist"))
    assert listing.status_code == 200
    assert "admin-view" in listing.content.decode()
    page = staff.get(reverse("admin:subaccounts_fundcollection_change", args=[collection.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    for expected in ("PARTIAL_SUCCESS", "Collected (one posting)", "Not collected (see the reason)", "frozen"):
        assert expected in text, expected
    assert staff.get(reverse("admin:subaccounts_fundcollection_add")).status_code == 403
    assert staff.post(reverse("admin:subaccounts_fundcollection_delete", args=[collection.pk])).status_code == 403
    assert (
        staff.post(
            reverse("admin:subaccounts_fundcollection_change", args=[collection.pk]), {"status": "SUCCESS"}
        ).status_code
        == 403
    )
    assert FundCollection.objects.get().status == CollectionStatus.PARTIAL_SUCCESS


# --- exactly once: twice, interrupted, and balances moving underneath ---------------------------------


def test_a_task_run_twice_collects_once(rich_family, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        h.ok(collect(rich_family.master, "twice"))
    pk = FundCollection.objects.get().pk
    first = fund_collection_task.apply(args=[pk]).get()
    postings = Posting.objects.count()
    second = fund_collection_task.apply(args=[pk]).get()
    assert (first, second) == ("SUCCESS", "SUCCESS")
    assert Posting.objects.count() == postings
    assert FundCollection.objects.get().attempts == 1  # the second delivery found it settled
    assert_ledger_balanced()


def test_an_interrupted_task_resumes_through_the_sweep_and_collects_each_sub_once(
    rich_family, monkeypatch, django_capture_on_commit_callbacks
):
    family = rich_family
    with django_capture_on_commit_callbacks(execute=False):
        h.ok(collect(family.master, "resume"))
    collection = FundCollection.objects.get()
    real = collection_service._collect_one
    calls = []

    def dies_on_the_second(collection, master, sub):
        calls.append(sub.pk)
        if len(calls) == 2:
            raise SystemExit("worker lost")  # as a killed process: after the first sub-account's commit
        real(collection, master, sub)

    monkeypatch.setattr(collection_service, "_collect_one", dies_on_the_second)
    with pytest.raises(SystemExit):
        collection_service.fund_collection_run(collection_id=collection.pk)
    collection.refresh_from_db()
    assert collection.status == CollectionStatus.PROCESSING
    assert postings_of(collection) == [f"fund-collect:{collection.pk}:{family.sub1.user.pk}"]
    monkeypatch.setattr(collection_service, "_collect_one", real)
    # Not yet old enough for the sweep; then old enough: handed to a worker again, which finishes.
    assert collection_service.fund_collections_retry_stuck(older_than_seconds=3600) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert collection_service.fund_collections_retry_stuck(older_than_seconds=0) == 1
    collection.refresh_from_db()
    assert (collection.status, collection.attempts) == (CollectionStatus.SUCCESS, 2)
    assert postings_of(collection) == sorted(
        f"fund-collect:{collection.pk}:{sub.user.pk}" for sub in (family.sub1, family.sub2)
    )
    assert free(family.master.user, "USDT") == Decimal("19.5")
    assert collection_service.fund_collections_retry_stuck(older_than_seconds=0) == 0  # settled: nothing to hand over
    assert_ledger_balanced()


def test_the_sweep_hands_over_an_init_task_left_by_a_broker_outage(family, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):  # the enqueue is lost
        h.ok(collect(family.master, "lost"))
    with django_capture_on_commit_callbacks(execute=True):
        assert collection_service.fund_collections_retry_stuck(older_than_seconds=0) == 1
    assert FundCollection.objects.get().status == CollectionStatus.SUCCESS
    assert_balance(family.master.user, "BTC", "1.5")


@pytest.mark.parametrize("change", ["in", "out"])
def test_a_balance_changed_between_the_read_and_the_lock_is_read_again(
    family, monkeypatch, django_capture_on_commit_callbacks, change
):
    """A transfer posted after the task read sub1's balance and before it took the ledger's lock:
    the guard sees the changed balance under the lock, and the task locks both ledger rows and reads
    again under the lock; it collects exactly what sub1 holds then, never more (no negative) and
    never a stale amount."""
    sub1 = family.sub1.user
    real = collection_service._free_balances
    injected = []

    def read_then_transfer(account_id):
        found = real(account_id)
        if account_id == sub1.pk and not injected:
            injected.append(True)
            params = {"asset": "BTC", "amount": "0.2"}
            params.update({"toEmail": sub1.email} if change == "in" else {"fromEmail": sub1.email})
            h.ok(family.master.client.post(h.UNIVERSAL, params))
        return found

    with django_capture_on_commit_callbacks(execute=False):
        h.ok(collect(family.master, f"moving-{change}"))
    monkeypatch.setattr(collection_service, "_free_balances", read_then_transfer)
    collection = collection_service.fund_collection_run(collection_id=FundCollection.objects.get().pk)
    assert collection.status == CollectionStatus.SUCCESS
    assert injected
    assert_balance(sub1, "BTC", "0")
    assert_balance(family.master.user, "BTC", "1.5")  # 1 + 0.5, whichever way the 0.2 went first
    outcome = FundCollectionOutcome.objects.get(collection=collection, sub=sub1)
    moved = outcome.posting.entries.get(account=sub1).amount
    assert moved == (Decimal("0.7") if change == "in" else Decimal("0.3"))
    assert_ledger_balanced()


# --- real concurrency (PostgreSQL, threads on their own connections) -----------------------------------


def run_at_once(count: int, work) -> list:
    """`work(i)` in `count` threads released together, each on its own connection; results or exceptions."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def one(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            results[i] = exc
        finally:
            connections.close_all()

    pool = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(150)
    assert not any(thread.is_alive() for thread in pool)
    return results


@pytest.fixture
def race_family(transactional_db):
    AssetFactory(code="BTC")
    return h.family_of("coll-race", master_funding={"BTC": "10"}, sub_funding={"BTC": "10"})


def _client(member: h.Customer) -> SignedClient:
    return SignedClient(member.api_key.key, member.secret)  # its own django.test.Client per thread


@pytest.mark.django_db(transaction=True)
def test_concurrent_collects_leave_one_init_task(race_family, monkeypatch):
    """20 collects with different ids at once while no worker runs: exactly one task is created,
    the others are -10324 (the partial unique constraint, not a read)."""
    monkeypatch.setattr(fund_collection_task, "delay", lambda *args: None)
    results = run_at_once(
        20, lambda i: _client(race_family.master).post(COLLECT, {"clientRequestId": f"race-{i}", "recvWindow": 60000})
    )
    codes = sorted(r.status_code if r.status_code == 200 else r.json()["code"] for r in results)
    assert codes == [-10324] * 19 + [200], codes
    assert FundCollection.objects.filter(status=CollectionStatus.INIT).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_twins_of_one_client_request_id(race_family, monkeypatch):
    monkeypatch.setattr(fund_collection_task, "delay", lambda *args: None)
    results = run_at_once(
        20, lambda i: _client(race_family.master).post(COLLECT, {"clientRequestId": "twin", "recvWindow": 60000 - i})
    )
    codes = sorted(r.status_code if r.status_code == 200 else r.json()["code"] for r in results)
    assert codes == [-1010] * 19 + [200], codes
    assert FundCollection.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_collection_racing_transfers_conserves_the_family(race_family):
    """Collections (the task in-process after each commit) while 8 threads move BTC among the
    family: no balance goes negative, the family's total is conserved, each task collects each
    sub-account at most once, the ledger check passes."""
    family = race_family
    members = [family.master, family.sub1, family.sub2]
    emails = [None, family.sub1.user.email, family.sub2.user.email]

    def work(i: int):
        if i == 0:
            outcomes = []
            for n in range(5):
                response = _client(family.master).post(COLLECT, {"clientRequestId": f"live-{n}", "recvWindow": 60000})
                outcomes.append(response.status_code)
            return outcomes
        client = _client(family.master)
        answers = []
        for n in range(15):
            source, target = emails[(i + n) % 3], emails[(i + n + 1) % 3]
            params = {"asset": "BTC", "amount": "0.37", "recvWindow": 60000, "clientTranId": f"t-{i}-{n}"}
            params.update({k: v for k, v in (("fromEmail", source), ("toEmail", target)) if v})
            response = client.post(h.UNIVERSAL, params)
            answers.append((f"t-{i}-{n}", response.status_code, response.json()))
        return answers

    results = run_at_once(9, work)
    assert results[0] == [200] * 5, results[0]
    # Every transfer thread finished and every one of the 120 transfers was answered: a move (result
    # true) or a recorded refusal for want of balance (result false, nothing moved), each as stored.
    errors = [r for r in results[1:] if not isinstance(r, list)]
    assert not errors, errors
    answers = [answer for thread in results[1:] for answer in thread]
    assert len(answers) == 120
    stored = {t.client_tran_id: t for t in SubAccountTransfer.objects.filter(master=family.master.user)}
    assert len(stored) == 120, sorted(stored)
    moved = 0
    for tran_id, status, body in answers:
        assert status == 200, (tran_id, status, body)
        assert body in ({"clientTransferId": tran_id, "result": True}, {"clientTransferId": tran_id, "result": False})
        transfer = stored[tran_id]
        if body["result"]:
            moved += 1
            assert (transfer.status, transfer.amount) == ("success", Decimal("0.37")), tran_id
            assert transfer.posting.entries.get(account=transfer.from_account).amount == Decimal("0.37")
        else:
            assert (transfer.status, transfer.posting) == ("failed", None), tran_id
    assert moved > 0  # the race raced: transfers moved money while the collections ran
    total = sum((free(m.user, "BTC") for m in members), Decimal(0))
    assert total == Decimal("20")
    for collection in FundCollection.objects.all():
        assert collection.status == CollectionStatus.SUCCESS, (collection.status, collection.comment)
        assert len(postings_of(collection)) == len(set(postings_of(collection)))
    assert not Balance.objects.filter(free__lt=0, allow_negative=False).exists()
    assert_ledger_balanced()
    connections.close_all()


# --- a real Celery worker killed in the middle of a collection ----------------------------------------

COLLECT_DB_NAME = f"{CRASH_DB_NAME}_collect"  # this worker's (tests/support/stack.py)
SETTLE_SECONDS = 40
SUBS = 6
ASSETS = ("BTC", "ETH", "USDT", "PHP")

CRASH_HOOK = '''"""Test-only Celery worker hook written by tests/subaccounts/test_collect.py: with CRASH_MARKER
set, the pool child (CRASH_WHOLE_WORKER: the whole worker) is SIGKILLed right after the task's
third sub-account was collected and committed, once per test."""

import os
import signal

from celery.signals import task_prerun

_patched = []


@task_prerun.connect
def _patch(**kwargs):
    if _patched:
        return
    from subaccounts import collection

    real = collection._collect_one
    done = []

    def collect_one(collection, master, sub):
        real(collection, master, sub)
        done.append(sub.pk)
        marker = os.environ.get("CRASH_MARKER")
        if marker and len(done) == 3:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, f"{os.getpid()} {sub.pk}".encode())
            os.close(fd)
            if os.environ.get("CRASH_WHOLE_WORKER"):
                os.killpg(os.getpgrp(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    collection._collect_one = collect_one
    _patched.append(True)
'''

BUILD_FAMILY = """
import json
from decimal import Decimal
from accounts import services
from accounts.ledger.models import Asset
from accounts.models import User
for code, fiat in (("BTC", False), ("ETH", False), ("USDT", False), ("PHP", True)):
    Asset.objects.get_or_create(code=code, defaults={"name": code, "is_fiat": fiat, "reference_price": Decimal(1)})
master = User.objects.filter(email="collector@crash.test").first()
if master is None:
    master = services.user_create(email="collector@crash.test", phone=None, password="crash-test-pw")
created = services.api_key_create(user=master, name="crash")
subs = []
for i in range(SUBS):
    email = f"collector-sub{i}@crash.test"
    sub = User.objects.filter(email=email).first() or services.user_create(email=email, master=master, is_virtual=True)
    subs.append(sub.pk)
print(json.dumps({"master": master.pk, "subs": subs, "key": created.api_key.key, "secret": created.secret}))
""".replace("SUBS", str(SUBS))

FUND_FAMILY = """
from decimal import Decimal
from accounts.ledger.services import funding_post
from accounts.models import User
import uuid
for sub in User.objects.filter(master__email="collector@crash.test").order_by("id"):
    for n, code in enumerate(("BTC", "ETH", "USDT", "PHP")):
        funding_post(account=sub, asset_code=code, amount=Decimal(n + 1) / 4, reference=f"crash:{uuid.uuid4().hex}")
print("funded")
"""


@dataclass
class CrashStack:
    env: dict[str, str]
    port: int
    db: object
    hook_dir: Path
    family: dict

    def one(self, sql: str, *args):
        return self.db.execute(sql, args).fetchone()

    def free(self, account_id: int) -> dict[str, Decimal]:
        rows = self.db.execute(
            "SELECT a.code, b.free FROM accounts_balance b JOIN accounts_asset a ON a.id = b.asset_id"
            " WHERE b.account_id = %s",
            (account_id,),
        ).fetchall()
        return {code: amount for code, amount in rows if amount}

    def fund(self) -> None:
        manage(self.env, "shell", "--no-imports", "-c", FUND_FAMILY)

    def collect(self, request_id: str) -> dict:
        import requests

        query = urlencode({"clientRequestId": request_id, "recvWindow": 60000, "timestamp": now_ms()})
        signature = hmac_hex(self.family["secret"], query)
        response = requests.post(
            f"http://127.0.0.1:{self.port}{COLLECT}?{query}&signature={signature}",
            headers={"X-SERVICE-APIKEY": self.family["key"]},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def collection(self, request_id: str) -> dict:
        row = self.one(
            "SELECT id, status, attempts, comment FROM subaccounts_fundcollection WHERE client_request_id = %s",
            request_id,
        )
        return {"id": row[0], "status": row[1], "attempts": row[2], "comment": row[3]}

    def wait_settled(self, request_id: str, worker: Proc) -> dict:
        deadline = time.time() + SETTLE_SECONDS
        while True:
            state = self.collection(request_id)
            if state["status"] not in ("INIT", "PROCESSING"):
                return state
            if time.time() > deadline:
                pytest.fail(f"collection {request_id} still {state} after {SETTLE_SECONDS}s:\n{worker.tail()}")
            time.sleep(0.1)

    @contextlib.contextmanager
    def worker(self, name: str, **extra_env: str):
        env = dict(self.env, PYTHONPATH=os.pathsep.join([str(self.hook_dir), str(ROOT)]), **extra_env)
        args = [PYTHON, "-m", "celery", "-A", "exchange", "worker", "--pool", "prefork", "--concurrency", "1"]
        args += ["--include", "collect_crash_hook", "--loglevel", "info", "--hostname", f"{name}@%h"]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        with process(args, env, name) as worker:
            yield worker

    def assert_collected_once(self, collection_id: int) -> None:
        references = [
            row[0]
            for row in self.db.execute(
                "SELECT reference FROM accounts_posting WHERE reference LIKE %s ORDER BY reference",
                (f"fund-collect:{collection_id}:%",),
            )
        ]
        assert references == sorted(f"fund-collect:{collection_id}:{sub}" for sub in self.family["subs"])
        outcomes = self.db.execute(
            "SELECT sub_id, status FROM subaccounts_fundcollectionoutcome WHERE collection_id = %s ORDER BY sub_id",
            (collection_id,),
        ).fetchall()
        assert outcomes == [(sub, "COLLECTED") for sub in sorted(self.family["subs"])]

    def assert_all_with_the_master(self, master_before: dict[str, Decimal]) -> None:
        expected = dict(master_before)
        for sub in self.family["subs"]:
            assert self.free(sub) == {}, sub
        for n, code in enumerate(ASSETS):
            expected[code] = expected.get(code, Decimal(0)) + Decimal(n + 1) / 4 * SUBS
        assert self.free(self.family["master"]) == expected

    def ledger_check(self) -> None:
        done = manage(self.env, "ledger_check", check=False)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def crash_stack():
    import json

    import psycopg

    with (
        tempfile.TemporaryDirectory(prefix="collect-crash-hook-") as tmp,
        private_services(COLLECT_DB_NAME, CRASH_REDIS_DB) as (database_url, redis_url),
    ):
        hook_dir = Path(tmp)
        (hook_dir / "collect_crash_hook.py").write_text(CRASH_HOOK)
        env = stack_env(
            drop=("PYTHONPATH", "CRASH_MARKER", "CRASH_WHOLE_WORKER"),
            DATABASE_URL=database_url,
            REDIS_URL=redis_url,
            CELERY_TASK_ALWAYS_EAGER="false",
            TRUSTED_PROXIES="",
            UID_WEIGHT_LIMIT_PER_MINUTE="100000",
            IP_WEIGHT_LIMIT_PER_MINUTE="100000",
        )
        manage(env, "migrate", "--no-input", "-v", "0")
        family = json.loads(manage(env, "shell", "--no-imports", "-c", BUILD_FAMILY).stdout.strip().splitlines()[-1])
        port = free_port()
        server_args = [PYTHON, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port)]
        server_args += ["--workers", "1", "--blocking-threads", "2", "--log-level", "warning", "--no-access-log"]
        server_args.append("exchange.wsgi:application")
        with (
            process(server_args, env, "granian") as server,
            psycopg.connect(env["DATABASE_URL"], autocommit=True) as db,
        ):
            wait_for_port(port, server)
            yield CrashStack(env, port, db, hook_dir, family)


def _wait_dead(proc: Proc) -> None:
    deadline = time.time() + SETTLE_SECONDS
    while proc.proc.poll() is None:
        if time.time() > deadline:
            pytest.fail(f"the worker was not killed:\n{proc.tail()}")
        time.sleep(0.1)


@pytest.mark.timeout(180)
@requires_services(CRASH_REDIS_DB)
def test_worker_child_killed_mid_collection_collects_each_sub_once(crash_stack, tmp_path):
    """The pool child is SIGKILLed after three of six sub-accounts were collected: acks_late +
    reject_on_worker_lost hand the message to a new child, which collects the other three."""
    stack = crash_stack
    stack.fund()
    master_before = stack.free(stack.family["master"])
    marker = tmp_path / "crashed"
    with stack.worker("collect-crash", CRASH_MARKER=str(marker)) as worker:
        assert stack.collect("crash-child") == {"clientRequestId": "crash-child", "status": "INIT", "comment": ""}
        state = stack.wait_settled("crash-child", worker)
        assert worker.proc.poll() is None, f"the worker's main process died:\n{worker.tail()}"
        log = worker.tail()
    assert marker.exists(), f"the hook never killed a pool child:\n{log}"
    assert (state["status"], state["attempts"], state["comment"]) == ("SUCCESS", 2, ""), log
    stack.assert_collected_once(state["id"])
    stack.assert_all_with_the_master(master_before)
    stack.ledger_check()


@pytest.mark.timeout(180)
@requires_services(CRASH_REDIS_DB)
def test_whole_worker_killed_mid_collection_is_finished_by_the_sweep(crash_stack, tmp_path):
    """The whole worker dies (main process and pool) after three sub-accounts: the message waits
    unacknowledged for the broker's visibility timeout, so the sweep (subaccounts.retry_stuck_collections,
    as beat runs it) hands the task to a fresh worker, which collects the other three once."""
    stack = crash_stack
    stack.fund()
    master_before = stack.free(stack.family["master"])
    marker = tmp_path / "crashed"
    with stack.worker("collect-doomed", CRASH_MARKER=str(marker), CRASH_WHOLE_WORKER="1") as doomed:
        stack.collect("crash-whole")
        _wait_dead(doomed)
        assert doomed.proc.returncode == -signal.SIGKILL
    assert marker.exists()
    state = stack.collection("crash-whole")
    assert state["status"] == "PROCESSING"
    done = stack.one("SELECT count(*) FROM subaccounts_fundcollectionoutcome WHERE collection_id = %s", state["id"])[0]
    assert done == 3
    with stack.worker("collect-rescue") as rescue:
        time.sleep(1.1)
        sweep = "from subaccounts import collection as s; print(s.fund_collections_retry_stuck(older_than_seconds=1))"
        assert manage(stack.env, "shell", "--no-imports", "-c", sweep).stdout.strip().splitlines()[-1] == "1"
        state = stack.wait_settled("crash-whole", rescue)
    assert (state["status"], state["attempts"]) == ("SUCCESS", 2)
    stack.assert_collected_once(state["id"])
    stack.assert_all_with_the_master(master_before)
    stack.ledger_check()
