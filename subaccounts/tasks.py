"""Thin tasks: load by id, call a service (docs/architecture.md). Loading this module hands the
collection task to subaccounts/collection.py (SubaccountsConfig.ready imports it)."""

from celery import shared_task

from exchange.runtime.outage import periodic
from subaccounts import collection


@shared_task(name="subaccounts.fund_collection", acks_late=True, reject_on_worker_lost=True, max_retries=None)
def fund_collection_task(collection_id: int) -> str:
    return collection.fund_collection_run(collection_id=collection_id).status


@shared_task(name="subaccounts.retry_stuck_collections")
@periodic("fund-collection-retry")
def retry_stuck_collections_task() -> int:
    return collection.fund_collections_retry_stuck()


# Looked up at each hand-over, not bound once: a test may replace `delay` (a broker that is down).
collection.set_worker(lambda collection_id: fund_collection_task.delay(collection_id))
