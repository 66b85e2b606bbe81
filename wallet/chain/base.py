"""What the wallet needs from a chain. Implementations must be safe to call again with the same
arguments: a withdrawal may be broadcast twice (a worker died after broadcasting), and the
second call must return the first transaction rather than send money again."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import Enum


class BroadcastFailed(Exception):
    """The chain refused the transaction; nothing was sent."""


class TxState(Enum):
    PENDING = "pending"
    CONFIRMED = "confirmed"
    FAILED = "failed"


@dataclass(frozen=True)
class SeenDeposit:
    tx_id: str
    output_index: int
    address: str
    tag: str
    amount: Decimal
    confirmations: int
    failed: bool = False


class ChainAdapter:
    def new_address(self, *, network, account_id: int) -> tuple[str, str]:
        """A fresh deposit address (and memo/tag, "" when the network has none) for the account."""
        raise NotImplementedError

    def broadcast(self, *, network, reference: str, address: str, tag: str, amount: Decimal) -> str:
        """Send `amount` to the address; return the transaction id. `reference` is ours and unique
        per withdrawal: calling again with it returns the same transaction. Raises BroadcastFailed."""
        raise NotImplementedError

    def confirmations(self, *, network, tx_id: str) -> tuple[TxState, int]:
        raise NotImplementedError

    def scan(self, *, network, addresses: dict[tuple[str, str], int]) -> list[SeenDeposit]:
        """Incoming transfers to any of `addresses` ((address, tag) -> account id) that the chain
        has seen, with their confirmations."""
        raise NotImplementedError
