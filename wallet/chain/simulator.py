"""The simulated chain (the default adapter): its transactions and block heights are rows of this
database, so every process (server, worker, `manage.py deposit`) sees the same chain.

- Blocks advance when `advance_blocks()` runs (the periodic task wallet.sim_advance_blocks, every
  SIM_CHAIN_BLOCK_SECONDS); a transaction has height-of-chain - its block + 1 confirmations.
- Addresses match the network's addressRegex (BTC bech32-like, ETH 0x-hex, TRX base58 "T..."; other
  networks: the first candidate form that matches); a memo is generated where memoRegex is set.
- Broadcasts to an address listed in SimBroadcastFailure fail; `send_to()` with fails=True makes a
  deposit that the chain later reports as failed.
"""

from __future__ import annotations

import re
import secrets
import string
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import F

from wallet.chain.base import BroadcastFailed, ChainAdapter, SeenDeposit, TxState
from wallet.models import SimBlockHeight, SimBroadcastFailure, SimTransaction

_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def _pick(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _candidates() -> list[str]:
    return [
        "bc1q" + _pick(_BECH32, 38),
        "0x" + _pick("0123456789abcdef", 40),
        "T" + _pick(_BASE58, 33),
        "1" + _pick(_BASE58, 33),
        _pick(string.ascii_letters + string.digits, 34),
    ]


def height(network: str) -> int:
    row, _ = SimBlockHeight.objects.get_or_create(network=network)
    return row.height


def advance_blocks(count: int = 1, network: str | None = None) -> None:
    networks = [network] if network else list(SimBlockHeight.objects.values_list("network", flat=True))
    for name in networks:
        SimBlockHeight.objects.get_or_create(network=name)
        SimBlockHeight.objects.filter(network=name).update(height=F("height") + count)


def send_to(
    *, network: str, address: str, tag: str, amount: Decimal, tx_id: str | None = None, fails: bool = False
) -> SimTransaction:
    """Someone outside sends coins to an address: a new transaction in the current block."""
    return SimTransaction.objects.create(
        network=network,
        tx_id=tx_id or _pick("0123456789abcdef", 64),
        output_index=0,
        address=address,
        tag=tag,
        amount=amount,
        block_height=height(network),
        incoming=True,
        fails=fails,
    )


class SimulatedChain(ChainAdapter):
    def new_address(self, *, network, account_id: int) -> tuple[str, str]:
        pattern = re.compile(network.address_regex)
        for _ in range(50):
            for candidate in _candidates():
                if pattern.fullmatch(candidate):
                    return candidate, self._memo(network)
        raise ValueError(f"The simulator cannot make an address matching {network.address_regex!r}")

    @staticmethod
    def _memo(network) -> str:
        if not network.memo_regex:
            return ""
        pattern = re.compile(network.memo_regex)
        for candidate in (str(secrets.randbelow(10**9) + 10**8), _pick(string.ascii_letters + string.digits, 10)):
            if pattern.fullmatch(candidate):
                return candidate
        raise ValueError(f"The simulator cannot make a memo matching {network.memo_regex!r}")

    def broadcast(self, *, network, reference: str, address: str, tag: str, amount: Decimal) -> str:
        existing = SimTransaction.objects.filter(client_reference=reference).first()
        if existing is not None:
            return existing.tx_id
        if SimBroadcastFailure.objects.filter(address=address).exists():
            raise BroadcastFailed(f"the simulated chain refused a transaction to {address}")
        try:
            with transaction.atomic():
                return SimTransaction.objects.create(
                    network=network.network,
                    tx_id=_pick("0123456789abcdef", 64),
                    output_index=0,
                    address=address,
                    tag=tag,
                    amount=amount,
                    block_height=height(network.network),
                    incoming=False,
                    client_reference=reference,
                ).tx_id
        except IntegrityError:  # broadcast concurrently with the same reference
            return SimTransaction.objects.get(client_reference=reference).tx_id

    def confirmations(self, *, network, tx_id: str) -> tuple[TxState, int]:
        tx = SimTransaction.objects.filter(network=network.network, tx_id=tx_id).first()
        if tx is None:
            return TxState.PENDING, 0
        count = max(0, height(network.network) - tx.block_height + 1)
        if tx.fails:
            return (TxState.FAILED, count) if count >= 1 else (TxState.PENDING, 0)
        return (TxState.CONFIRMED if count >= max(1, network.min_confirm) else TxState.PENDING), count

    def scan(self, *, network, addresses: dict[tuple[str, str], int]) -> list[SeenDeposit]:
        current = height(network.network)
        seen = []
        for tx in SimTransaction.objects.filter(network=network.network, incoming=True):
            if (tx.address, tx.tag) not in addresses:
                continue
            seen.append(
                SeenDeposit(
                    tx_id=tx.tx_id,
                    output_index=tx.output_index,
                    address=tx.address,
                    tag=tx.tag,
                    amount=tx.amount,
                    confirmations=max(0, current - tx.block_height + 1),
                    failed=tx.fails,
                )
            )
        return seen
