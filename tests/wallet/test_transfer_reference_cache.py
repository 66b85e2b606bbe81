"""The transfer fees and limit tiers every transfer reads are cached per process
(exchange/runtime/ttlcache.py ReferenceCache): a fee raised or a limit lowered by staff through the
four-eyes path (a tightening: applied at once) is enforced by another process within
REFERENCE_REVOCATION_SECONDS. The other process is a real one (tests/wallet/transfer_cache_worker.py)
on the same test database and Redis, with REFERENCE_CACHE_SECONDS at 60 so that only the
invalidation can deliver the change in time; the control shows that it really answers from its
cache (a change that bypasses the invalidation is not seen)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection

from accounts.models import LimitPeriod, LimitTier, TierLimit
from exchange.backoffice import changes
from exchange.backoffice.roles import ADMINISTRATOR
from tests.support.assertions import assert_ledger_balanced
from tests.support.factories import AssetFactory, UserFactory, customer
from tests.support.other_process import NEEDS_POSTGRESQL, OtherProcess, seconds_after
from tests.support.staff import staff_member
from wallet.models import TransferFee

pytestmark = pytest.mark.django_db(transaction=True)

ROOMY = Decimal(10**9)


@pytest.fixture
def other_process():
    if connection.vendor != "postgresql":
        pytest.skip(NEEDS_POSTGRESQL)
    TransferFee.objects.create(asset=AssetFactory(code="PHP"), fee=Decimal("0.5"))
    tier = LimitTier.objects.create(name="roomy", currency="PHP")
    TierLimit.objects.create(
        tier=tier, period=LimitPeriod.DAILY, cash_in_limit=ROOMY, cash_out_limit=ROOMY, total_withdraw_limit=ROOMY
    )
    sender = customer(funding={"PHP": "100000"}).user
    sender.limit_tier = tier
    sender.save()
    other = OtherProcess("tests.wallet.transfer_cache_worker", str(sender.pk), UserFactory().email)
    assert other.ask("warm") == ["warm", "0.500000000000000000"]
    yield other
    other.close()
    assert_ledger_balanced()


def _change(obj, **wanted) -> None:
    """An Administrator's change through the four-eyes path; a tightening is applied at once."""
    outcome = changes.change_submit(actor=staff_member(ADMINISTRATOR), obj=obj, changes=wanted, reason="ticket 36")
    assert outcome.applied


def test_a_raised_fee_reaches_another_process_within_the_bound(other_process, capsys):
    fee = TransferFee.objects.get(asset__code="PHP")
    answer, committed = other_process.watch(lambda: _change(fee, fee=Decimal(2)))
    assert answer[0] == "fee", f"the other process still charged the old fee after 5 s: {answer}"
    assert Decimal(answer[2]) == 2
    assert seconds_after(answer, committed, "transfer fee", capsys) < settings.REFERENCE_REVOCATION_SECONDS


def test_a_lowered_limit_reaches_another_process_within_the_bound(other_process, capsys):
    limit = TierLimit.objects.get(tier__name="roomy")  # the warm-up sent 2 PHP (and 1 PHP of fees) today
    answer, committed = other_process.watch(lambda: _change(limit, cash_out_limit=Decimal(1)))
    assert answer[0] == "refused", f"the other process still sent on the old limit after 5 s: {answer}"
    assert answer[2] == "-1010 The daily cash-out limit would be exceeded."
    assert seconds_after(answer, committed, "limit tier", capsys) < settings.REFERENCE_REVOCATION_SECONDS


def test_the_other_process_answers_from_its_cache(other_process):
    """The control: a change that bypasses the invalidation (raw SQL) is not seen by the other
    process past the bound, so the tests above measure the invalidation, not a database read."""

    def behind_the_caches_back() -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE wallet_transferfee SET fee = 2")
            cursor.execute("UPDATE accounts_tierlimit SET cash_out_limit = 1")

    answer, _ = other_process.watch(behind_the_caches_back, seconds=2 * settings.REFERENCE_REVOCATION_SECONDS)
    assert answer[0] == "unchanged"
