"""The periodic sweeps and the dashboard's queues read the few open withdrawals and deposits through
partial indexes (wallet/migrations/0004), never the whole settled history: with 30,000 settled rows
of each, no query of theirs scans the table."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.backoffice import awaiting_withdrawal, held_deposit, usdt_customer
from wallet.models import (
    CONFIRMATIONS_FOLLOWED,
    Deposit,
    DepositStatus,
    Withdrawal,
    WithdrawalStage,
)

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")

HISTORY = 30_000


def _plan(queryset) -> str:
    return queryset.explain()


@pytest.mark.django_db
def test_sweeps_and_queues_use_the_partial_indexes():
    user = usdt_customer().user
    waiting = awaiting_withdrawal(user)
    held = held_deposit(user)
    Withdrawal.objects.bulk_create(
        Withdrawal(
            account=user,
            network=waiting.network,
            address=waiting.address,
            amount=Decimal(1),
            fee=Decimal(0),
            stage=WithdrawalStage.SUCCEEDED,
            tx_id=f"settled-{n}",
            confirmations=CONFIRMATIONS_FOLLOWED,
        )
        for n in range(HISTORY)
    )
    Deposit.objects.bulk_create(
        Deposit(
            account=user,
            network=held.network,
            address=held.address,
            amount=Decimal(1),
            tx_id=f"credited-{n}",
            status=DepositStatus.SUCCESS,
            confirmations=100,
        )
        for n in range(HISTORY)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE wallet_withdrawal")
        cursor.execute("ANALYZE wallet_deposit")
    cutoff = timezone.now() + timedelta(minutes=1)
    queries = {
        "withdrawal_open": [
            Withdrawal.objects.filter(stage=WithdrawalStage.AWAITING_APPROVAL),  # dashboard: awaiting approval
            Withdrawal.objects.filter(stage=WithdrawalStage.BROADCASTING, updated_at__lt=cutoff),  # dashboard: stuck
            Withdrawal.objects.filter(  # wallet.settlement.withdrawals_retry_stuck, every minute
                stage__in=[WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING], updated_at__lt=cutoff
            ),
        ],
        "withdrawal_confirming": [  # wallet.settlement.withdrawals_refresh_confirmations
            Withdrawal.objects.filter(stage=WithdrawalStage.SUCCEEDED, confirmations__lt=CONFIRMATIONS_FOLLOWED)
            .exclude(tx_id="")
            .order_by("id")[:500]
        ],
        "deposit_open": [Deposit.objects.filter(status=DepositStatus.NEED_FILL_DATA)],  # dashboard: travel rule
    }
    for index, querysets in queries.items():
        for queryset in querysets:
            plan = _plan(queryset)
            assert "Seq Scan" not in plan, plan
            assert index in plan, plan
    # And they find what they must.
    assert list(queries["withdrawal_open"][0]) == [waiting]
    assert list(queries["deposit_open"][0]) == [held]
    assert not list(queries["withdrawal_confirming"][0])
