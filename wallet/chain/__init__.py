"""The chain behind an adapter. `adapter()` returns the one named by settings.CHAIN_ADAPTER
(default: the simulated chain). See base.py for the interface and docs/wallet.md for plugging in a
real node."""

from functools import lru_cache

from django.conf import settings
from django.utils.module_loading import import_string

from wallet.chain.base import BroadcastFailed, ChainAdapter, SeenDeposit, TxState


@lru_cache(maxsize=2)
def _adapter_for(path: str) -> ChainAdapter:
    return import_string(path)()


def adapter() -> ChainAdapter:
    return _adapter_for(settings.CHAIN_ADAPTER)


__all__ = ["BroadcastFailed", "ChainAdapter", "SeenDeposit", "TxState", "adapter"]
