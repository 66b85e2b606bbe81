"""The transaction history reads an account's entries from the posting-id range of its window
(accounts/selectors.posting_id_bounds), not from the account's first posting on, and lists exactly
what a scan of the whole journal would."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import selectors
from accounts.ledger.posting import api as posting_module
from accounts.models import Asset, Entry, Posting
from tests.support.factories import AssetFactory, UserFactory, deposit

DAY = timedelta(days=1)


def _deposit_at(moment, user, amount: str):
    """A deposit posted at `moment`, as the clock said then (postings are made in time order here,
    as they are in production: each id is given right after its time is taken)."""
    with mock.patch.object(posting_module.timezone, "now", return_value=moment):
        return deposit(user, amount, "BTC")


def _everything(user, asset: Asset, start, end) -> list[tuple[int, Decimal]]:
    """What the journal says, read without bounds: (posting id, net change) in the window."""
    totals: dict[int, Decimal] = {}
    for posting_id, side, amount in Entry.objects.filter(
        account=user, asset=asset, posting__created_at__gte=start, posting__created_at__lte=end
    ).values_list("posting_id", "side", "amount"):
        totals[posting_id] = totals.get(posting_id, Decimal(0)) + side * amount
    return sorted((pid, change) for pid, change in totals.items() if change)


@pytest.mark.django_db
def test_history_windows_read_the_id_range_and_list_what_the_journal_holds():
    btc = AssetFactory(code="BTC")
    busy, other = UserFactory(), UserFactory()
    now = timezone.now()
    first = now - 40 * DAY
    made = []
    for hour in range(0, 40 * 24, 7):  # every 7 hours for 40 days, two accounts interleaved
        moment = first + timedelta(hours=hour)
        made.append(_deposit_at(moment, busy, "1").posting_id)
        _deposit_at(moment + timedelta(minutes=1), other, "2")
    windows = [
        (now - 7 * DAY, now),  # the default: the last 7 days
        (first + 10 * DAY, first + 17 * DAY),  # in the middle
        (first - DAY, first + 6 * DAY),  # from before the first posting
        (now - 2 * DAY, now + 5 * DAY),  # into the future
        (first + 3 * DAY, first + 3 * DAY + timedelta(minutes=30)),  # nothing in it
    ]
    for start, end in windows:
        lower, upper = selectors.posting_id_bounds(start, end)
        expected = _everything(busy, btc, start, end)
        page = selectors.transaction_history(user=busy, asset=btc, start=start, end=end, page=1, size=500)
        assert [(row.posting_id, row.changed) for row in page.rows] == expected, (start, end)
        inside = [pid for pid, _ in expected]
        assert all((lower is None or pid > lower) and (upper is None or pid < upper) for pid in inside)
        # The bounds cut the account's history down to the window plus the margin on each side.
        in_range = [pid for pid in made if (lower is None or pid > lower) and (upper is None or pid < upper)]
        assert len(in_range) <= len(inside) + 2 * 1 + 2, (start, end, len(in_range), len(inside))

    # The middle window: both bounds are in the statement that reads the entries.
    start, end = windows[1]
    with CaptureQueriesContext(connection) as queries:
        selectors.transaction_history(user=busy, asset=btc, start=start, end=end, page=1, size=100)
    reading = [q["sql"] for q in queries.captured_queries if "accounts_entry" in q["sql"]]
    assert len(reading) == 1
    assert '"accounts_entry"."posting_id" >' in reading[0]
    assert '"accounts_entry"."posting_id" <' in reading[0]


@pytest.mark.django_db
def test_a_posting_takes_its_time_once_it_holds_its_locks():
    """created_at is read after the lock wait, right before the statement that gives the id: the
    id's order and the time's order then differ by milliseconds (the bounds' premise)."""
    AssetFactory(code="BTC")
    user = UserFactory()
    lock_accounts = posting_module._lock_accounts
    locked_at = []

    def slow_locks(account_ids):
        held = lock_accounts(account_ids)
        time.sleep(0.3)  # another posting held them this long
        locked_at.append(timezone.now())
        return held

    with mock.patch.object(posting_module, "_lock_accounts", side_effect=slow_locks):
        result = deposit(user, "1", "BTC")
    assert result.created_at >= locked_at[0]
    assert Posting.objects.get(pk=result.posting_id).created_at >= locked_at[0]


@pytest.mark.django_db
def test_a_posting_dated_in_the_future_by_a_wrong_clock_hides_nothing():
    """A host whose clock is hours fast dates one posting in the future; the default window (the
    last 7 days, ending now) takes no upper bound, so the honest postings after it are all listed."""
    btc = AssetFactory(code="BTC")
    user = UserFactory()
    now = timezone.now()
    _deposit_at(now - 2 * DAY, user, "1")
    _deposit_at(now + timedelta(hours=3), user, "2")  # the wrong clock
    honest = [_deposit_at(now - timedelta(minutes=10 - n), user, "3").posting_id for n in range(3)]
    page = selectors.transaction_history(user=user, asset=btc, start=now - 7 * DAY, end=now, page=1, size=100)
    listed = [row.posting_id for row in page.rows]
    assert all(pid in listed for pid in honest), listed
    assert [pid for pid, _ in _everything(user, btc, now - 7 * DAY, now)] == listed


@pytest.mark.django_db
def test_windows_at_the_ends_of_representable_time_are_no_error():
    btc = AssetFactory(code="BTC")
    user = UserFactory()
    deposit(user, "1", "BTC")
    last = datetime.max.replace(tzinfo=UTC) - timedelta(minutes=30)
    first = datetime.min.replace(tzinfo=UTC) + timedelta(minutes=30)
    assert selectors.posting_id_bounds(last - 7 * DAY, last)[1] is None
    assert selectors.posting_id_bounds(first, first + 7 * DAY)[0] is None
    page = selectors.transaction_history(user=user, asset=btc, start=last - 7 * DAY, end=last, page=1, size=10)
    assert page.rows == []
