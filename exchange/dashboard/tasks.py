from celery import shared_task

from exchange.dashboard.activity import activity_fold
from exchange.runtime.outage import periodic


@shared_task(name="exchange.activity_rollup")
@periodic("activity-rollup")
def activity_rollup_task() -> int:
    """Periodic: fold the journal's new postings into the dashboard's daily activity rollup."""
    return activity_fold(wait=False)
