"""Thin tasks: call a service."""

from celery import shared_task

from convert import prices
from exchange.runtime.outage import periodic


@shared_task(name="convert.market_tick")
@periodic("convert-market-tick")
def market_tick_task() -> int:
    """Move and confirm the prices (the default source's simulated market; a real feed may do nothing)."""
    return prices.source().tick()
