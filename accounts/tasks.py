from celery import shared_task

from accounts.ledger.check import ledger_check
from exchange.runtime.outage import periodic


@shared_task(name="accounts.ledger_check")
@periodic("ledger-check")
def ledger_check_task() -> bool:
    """Periodic: record the ledger check's result for the admin."""
    return ledger_check(record=True).ok
