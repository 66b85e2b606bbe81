"""Thin tasks: load by id, call a service (DESIGN.md section 4)."""

from celery import shared_task

from exchange.outage import periodic
from subaccounts import services


@shared_task(name="subaccounts.fund_collection", acks_late=True, reject_on_worker_lost=True, max_retries=None)
def fund_collection_task(collection_id: int) -> str:
    return services.fund_collection_run(collection_id=collection_id).status


@shared_task(name="subaccounts.retry_stuck_collections")
@periodic("fund-collection-retry")
def retry_stuck_collections_task() -> int:
    return services.fund_collections_retry_stuck()
