"""Thin tasks: load by id, call a service. Loading this module hands the withdrawal task to
wallet/settlement.py (WalletConfig.ready imports it)."""

from celery import shared_task
from django.conf import settings

from exchange.runtime.outage import periodic
from wallet import deposits, settlement


@shared_task(name="wallet.withdrawal_process", acks_late=True, reject_on_worker_lost=True, max_retries=None)
def withdrawal_process_task(withdrawal_id: int) -> str:
    return settlement.withdrawal_process(withdrawal_id=withdrawal_id).stage


@shared_task(name="wallet.scan_deposits")
@periodic("chain-scan")
def scan_deposits_task() -> int:
    touched = deposits.deposits_scan()
    settlement.withdrawals_refresh_confirmations()
    return touched


@shared_task(name="wallet.retry_stuck_withdrawals")
@periodic("withdrawal-retry")
def retry_stuck_withdrawals_task() -> int:
    return settlement.withdrawals_retry_stuck()


@shared_task(name="wallet.sim_advance_blocks")
@periodic("sim-chain-blocks")
def sim_advance_blocks_task() -> None:
    if settings.CHAIN_ADAPTER.endswith("SimulatedChain"):
        from wallet.chain.simulator import advance_blocks

        advance_blocks()


# Looked up at each hand-over, not bound once: a test may replace `delay` (a broker that is down).
settlement.set_worker(lambda withdrawal_id: withdrawal_process_task.delay(withdrawal_id))
