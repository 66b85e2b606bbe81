"""An untimed collect refused after its signature was checked cannot be replayed later (issue 34,
finding 8). The collect call is the one signed write that may come without a timestamp (the Postman
collection sends none), so no window ends its signature's validity: a request refused by a limit
(429), a disabled key (-2015) or the key's IP list (-2017) used to run (200 INIT) when the same
signed request was sent again once the cause was lifted. Now its signature is spent the moment it
verifies, in the database for ever (exchange/api/untimed.py): the replay is -1022 and no money
moves, even after the rate-limit storage was emptied (a Redis flush, a new embedded process)."""

from __future__ import annotations

import pytest

from accounts import services as account_services
from accounts.models import ApiKey
from exchange.api import ratelimit
from exchange.api.models import UntimedSignature
from subaccounts.models import FundCollection
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.client import now_ms, postman_call

COLLECT = "/openapi/v1/fund-collect/collect-from-sub-account"
RECORDS = "/openapi/v1/fund-collect/get-fund-record"


@pytest.fixture(autouse=True, params=["redis", "memory"])
def rate_limit_storage(request, settings):
    """Each test on the test run's Redis and on process memory (the embedded mode's storage; the
    embedded database is SQLite: `make test` runs this module again with exchange.settings.test_sqlite)."""
    if request.param == "memory":
        settings.RATE_LIMIT_STORAGE_URL = "memory://"
        ratelimit.counters().reset()
    yield request.param
    if request.param == "memory":
        ratelimit.counters().reset()


def untimed_collect(who: h.Customer, request_id: str):
    """The collect call as the Postman collection sends it: no timestamp, no recvWindow."""
    return postman_call(who.client, "POST", COLLECT, {"clientRequestId": request_id, "remark": ""}, timestamp=False)


def assert_replay_refused_and_nothing_moved(family: h.Family, request_id: str, captured) -> None:
    """The identical signed request, replayed after the cause was lifted and after the rate-limit
    storage forgot everything: refused as a replay both times; no task, no money moved."""
    with captured(execute=True):
        assert_error(untimed_collect(family.master, request_id), -1022, 401, msg_contains="replay")
        ratelimit.counters().reset()  # the storage's memory gone (a Redis flush, a new embedded process)
        assert_error(untimed_collect(family.master, request_id), -1022, 401, msg_contains="replay")
    assert not FundCollection.objects.exists()
    assert_balance(family.sub1.user, "BTC", "0.5")
    assert_balance(family.master.user, "BTC", "1")
    assert_ledger_balanced()
    # The same collection signed anew (a fresh clientRequestId) is the customer's to make.
    with captured(execute=True):
        assert h.ok(untimed_collect(family.master, f"{request_id}-again"))["status"] == "INIT"
    assert_balance(family.sub1.user, "BTC", "0")
    assert_ledger_balanced()


def test_refused_by_the_rate_limit_then_replayed(family, settings, django_capture_on_commit_callbacks):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 2
    h.ok(family.master.client.get(RECORDS))  # the key is known to the process: checked before the charge
    h.ok(family.master.client.get(RECORDS))
    assert_error(untimed_collect(family.master, "limited"), -1003, 429)
    ratelimit.counters().reset()  # the minute is over
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    assert_replay_refused_and_nothing_moved(family, "limited", django_capture_on_commit_callbacks)


def test_refused_by_the_limit_before_the_key_was_looked_up_then_replayed(
    family, settings, django_capture_on_commit_callbacks
):
    """A key the process has not cached is charged before the database is asked: the 429 comes
    before the signature check, and the signature is still spent."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 0
    assert_error(untimed_collect(family.master, "early"), -1003, 429)
    ratelimit.counters().reset()
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    assert_replay_refused_and_nothing_moved(family, "early", django_capture_on_commit_callbacks)


def test_refused_for_a_disabled_key_then_replayed(family, django_capture_on_commit_callbacks):
    key = ApiKey.objects.get(pk=family.master.api_key.pk)
    account_services.api_key_set_status(api_key=key, enabled=False)
    assert_error(untimed_collect(family.master, "disabled"), -2015, 401)
    account_services.api_key_set_status(api_key=key, enabled=True)
    assert_replay_refused_and_nothing_moved(family, "disabled", django_capture_on_commit_callbacks)


def test_refused_by_the_ip_list_then_replayed(family, django_capture_on_commit_callbacks):
    key = ApiKey.objects.get(pk=family.master.api_key.pk)
    account_services.api_key_set_ip_restriction(api_key=key, ip_restrict=True, ip_list=["192.0.2.1"])
    assert_error(untimed_collect(family.master, "elsewhere"), -2017, 401)
    account_services.api_key_set_ip_restriction(api_key=key, ip_restrict=True, ip_list=["192.0.2.1", "127.0.0.1"])
    assert_replay_refused_and_nothing_moved(family, "elsewhere", django_capture_on_commit_callbacks)


def test_a_bad_signature_or_a_timed_refusal_spends_nothing(family, django_capture_on_commit_callbacks):
    """Only a signature that verifies is recorded; a timed request refused by the IP list may still
    be sent again within its window once the address is added (its window is what ends it)."""
    forged = family.master.client.client.generic(
        "POST",
        f"{COLLECT}?clientRequestId=forged&remark=&signature={'0' * 64}",
        content_type="application/x-www-form-urlencoded",
        headers={"X-SERVICE-APIKEY": family.master.api_key.key},
    )
    assert_error(forged, -1022, 401, msg_contains="ignature")
    assert not UntimedSignature.objects.exists()

    key = ApiKey.objects.get(pk=family.master.api_key.pk)
    account_services.api_key_set_ip_restriction(api_key=key, ip_restrict=True, ip_list=["192.0.2.1"])
    timestamp = now_ms()
    assert_error(family.master.client.post(COLLECT, {"clientRequestId": "timed"}, timestamp=timestamp), -2017, 401)
    account_services.api_key_set_ip_restriction(api_key=key, ip_restrict=True, ip_list=["127.0.0.1"])
    with django_capture_on_commit_callbacks(execute=True):
        h.ok(family.master.client.post(COLLECT, {"clientRequestId": "timed"}, timestamp=timestamp))
    assert not UntimedSignature.objects.exists()
    assert_balance(family.sub1.user, "BTC", "0")
    assert_ledger_balanced()


@pytest.mark.parametrize("refusal", ["disabled", "ip_list"])
def test_the_refused_signature_is_recorded_once(family, refusal):
    key = ApiKey.objects.get(pk=family.master.api_key.pk)
    if refusal == "disabled":
        account_services.api_key_set_status(api_key=key, enabled=False)
    else:
        account_services.api_key_set_ip_restriction(api_key=key, ip_restrict=True, ip_list=["192.0.2.1"])
    for _ in range(3):
        assert untimed_collect(family.master, "again").status_code == 401
    assert UntimedSignature.objects.filter(api_key=key.key).count() == 1
