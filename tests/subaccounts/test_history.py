"""Transfer histories (issue 15, item 6): universal-transfer-history (master) and sub-history
(sub-account): filters, the 30-day period (endTime excluded), paging, `{result, total}` ascending,
the spec's transfer record."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from subaccounts.models import SubAccountTransfer
from tests.subaccounts import helpers as h
from tests.support.assertions import assert_error

DAY_MS = 24 * 3600 * 1000


def universal(family, **params):
    return h.ok(family.master.client.post(h.UNIVERSAL, {"asset": "BTC", **params}))


@pytest.fixture
def moves(family, other_family):
    """master→sub1 (a), sub1→sub2 (b), sub1→master (c, sub-to-master), master→sub2 in PHP (d), and
    a failed sub2→master (e); the other family moves too."""
    universal(family, toEmail=family.sub1.user.email, amount="0.1", clientTranId="a")
    universal(family, fromEmail=family.sub1.user.email, toEmail=family.sub2.user.email, amount="0.2", clientTranId="b")
    h.ok(family.sub1.client.post(h.SUB_TO_MASTER, {"asset": "BTC", "amount": "0.05", "clientTranId": "c"}))
    h.ok(
        family.master.client.post(
            h.UNIVERSAL, {"toEmail": family.sub2.user.email, "asset": "PHP", "amount": "5", "clientTranId": "d"}
        )
    )
    assert universal(family, fromEmail=family.sub2.user.email, amount="9", clientTranId="e")["result"] is False
    h.ok(
        other_family.master.client.post(
            h.UNIVERSAL, {"toEmail": other_family.sub1.user.email, "asset": "BTC", "amount": "0.1", "clientTranId": "a"}
        )
    )
    return family


def ids(body) -> list[str]:
    return [r["clientTranId"] for r in body["result"]]


def test_default_is_from_the_master(moves):
    body = h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY))
    assert set(body) == {"result", "total"}
    assert ids(body) == ["a", "d"]
    assert body["total"] == 2
    record = body["result"][0]
    assert set(record) == {"clientTranId", "fromEmail", "toEmail", "asset", "amount", "createdAt", "status"}
    assert record["fromEmail"] == moves.master.user.email
    assert record["toEmail"] == moves.sub1.user.email
    assert record["asset"] == "BTC"
    assert record["amount"] == "0.10000000"
    assert isinstance(record["createdAt"], int)
    assert record["createdAt"] == int(
        SubAccountTransfer.objects.get(master=moves.master.user, client_tran_id="a").created_at.timestamp() * 1000
    )
    assert record["status"] == "success"


def test_from_a_sub_account(moves):
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"fromEmail": moves.sub1.user.email}))) == ["b", "c"]


def test_to_a_sub_account(moves):
    body = h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"toEmail": moves.sub2.user.email}))
    assert ids(body) == ["b", "d"]
    assert body["result"][1]["amount"] == "5.00"


def test_failed_transfers_are_listed_as_failed(moves):
    body = h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"fromEmail": moves.sub2.user.email}))
    assert [(r["clientTranId"], r["status"]) for r in body["result"]] == [("e", "failed")]


def test_not_both_emails(moves):
    response = moves.master.client.get(
        h.UNIVERSAL_HISTORY, {"fromEmail": moves.sub1.user.email, "toEmail": moves.sub2.user.email}
    )
    assert_error(response, -1107, 400)


def test_client_tran_id_and_token_id_filters(moves):
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"clientTranId": "d"}))) == ["d"]
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"clientTranId": "b"}))) == []  # not from the master
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"tokenId": "PHP"}))) == ["d"]
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"tokenId": "USDT"}))) == []


def test_paging(moves):
    body = h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"limit": 1, "page": 2}))
    assert (ids(body), body["total"]) == (["d"], 2)
    assert h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"limit": 1, "page": 3})) == {"result": [], "total": 2}
    for bad in ({"limit": 501}, {"limit": 0}, {"page": 0}):
        assert_error(moves.master.client.get(h.UNIVERSAL_HISTORY, bad), -1025, 400)


def age(client_tran_id: str, days: float) -> SubAccountTransfer:
    row = SubAccountTransfer.objects.get(client_tran_id=client_tran_id, master__email__startswith="fam-")
    SubAccountTransfer.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(days=days))
    row.refresh_from_db()
    return row


def ms(moment) -> int:
    return int(moment.timestamp() * 1000)


def test_last_30_days_by_default(moves):
    """d, 29.9 days old, is still listed; a, 30.1 days old, no longer (a window of a day or of 31
    days fails this)."""
    age("d", 29.9)
    age("a", 30.1)
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY))) == ["d"]


def test_end_time_is_excluded_and_start_time_included(moves):
    a = age("a", 2)
    at = ms(a.created_at)
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": at, "endTime": at + 1}))) == ["a"]
    # a's time truncated to ms may be a fraction before it: endTime = that ms excludes it
    SubAccountTransfer.objects.filter(pk=a.pk).update(
        created_at=a.created_at.replace(microsecond=a.created_at.microsecond // 1000 * 1000)
    )
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": at - 10, "endTime": at}))) == []
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": at, "endTime": at + 1}))) == ["a"]


def test_only_start_time_means_the_30_days_after_it(moves):
    a = age("a", 40)
    body = h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": ms(a.created_at) - 1000}))
    assert ids(body) == ["a"]


def test_only_end_time_means_the_30_days_before_it(moves):
    a = age("a", 40)
    end = ms(a.created_at) + 1000
    assert ids(h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"endTime": end}))) == ["a"]


def test_period_longer_than_30_days_refused(moves):
    now = ms(timezone.now())
    response = moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": now - 30 * DAY_MS - 1, "endTime": now})
    assert_error(response, -1025, 400, msg_contains="30 days")
    h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": now - 30 * DAY_MS, "endTime": now}))


def test_end_before_start_refused(moves):
    now = ms(timezone.now())
    assert_error(moves.master.client.get(h.UNIVERSAL_HISTORY, {"startTime": now, "endTime": now - 1}), -1025, 400)


def test_another_familys_transfers_are_never_seen(moves, other_family):
    body = h.ok(moves.master.client.get(h.UNIVERSAL_HISTORY, {"clientTranId": "a"}))
    assert [r["toEmail"] for r in body["result"]] == [moves.sub1.user.email]
    assert_error(moves.master.client.get(h.UNIVERSAL_HISTORY, {"toEmail": other_family.sub1.user.email}), -1151)


# --- sub-history ------------------------------------------------------------------------------


def test_sub_history_out_by_default(moves):
    body = h.ok(moves.sub1.client.get(h.SUB_HISTORY))
    assert ids(body) == ["b", "c"]
    assert body["total"] == 2
    assert set(body["result"][0]) == {"clientTranId", "fromEmail", "toEmail", "asset", "amount", "createdAt", "status"}


@pytest.mark.parametrize("type_", ["2", "3", "0", "x", "-1"])
def test_sub_history_any_other_type_means_out(moves, type_):
    assert ids(h.ok(moves.sub1.client.get(h.SUB_HISTORY, {"type": type_}))) == ["b", "c"]


def test_sub_history_in(moves):
    assert ids(h.ok(moves.sub1.client.get(h.SUB_HISTORY, {"type": 1}))) == ["a"]
    assert ids(h.ok(moves.sub2.client.get(h.SUB_HISTORY, {"type": 1}))) == ["b", "d"]


def test_sub_history_filters_and_paging(moves):
    assert ids(h.ok(moves.sub2.client.get(h.SUB_HISTORY, {"type": 1, "asset": "PHP"}))) == ["d"]
    assert ids(h.ok(moves.sub1.client.get(h.SUB_HISTORY, {"clientTranId": "c"}))) == ["c"]
    body = h.ok(moves.sub1.client.get(h.SUB_HISTORY, {"limit": 1, "page": 2}))
    assert (ids(body), body["total"]) == (["c"], 2)
    assert_error(moves.sub1.client.get(h.SUB_HISTORY, {"limit": 501}), -1025)


def test_sub_history_period(moves):
    age("b", 31)
    assert ids(h.ok(moves.sub1.client.get(h.SUB_HISTORY))) == ["c"]
    now = ms(timezone.now())
    assert_error(moves.sub1.client.get(h.SUB_HISTORY, {"startTime": now - 31 * DAY_MS, "endTime": now}), -1025)


def test_sub_history_shows_only_the_callers_own_transfers(moves, other_family):
    assert ids(h.ok(other_family.sub1.client.get(h.SUB_HISTORY, {"type": 1}))) == ["a"]
    assert (
        h.ok(other_family.sub1.client.get(h.SUB_HISTORY, {"type": 1}))["result"][0]["fromEmail"]
        == other_family.master.user.email
    )
    assert ids(h.ok(moves.sub2.client.get(h.SUB_HISTORY))) == ["e"]
