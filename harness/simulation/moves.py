"""What the simulation records of each operation with a client id (`Move`), and its amounts drawn
from the seed (`_amount`); shared by the simulation and its cycle customer
(cycles.py)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from decimal import Decimal


def _amount(rng: random.Random, bounds: tuple[float, float], places: int) -> str:
    low, high = bounds
    step = Decimal(1).scaleb(-places)
    value = Decimal(str(rng.uniform(low, high))).quantize(step)
    return f"{max(value, Decimal(str(low)).quantize(step)):f}"


@dataclass
class Move:
    """An operation with a client id (or a quote, a deposit's transaction): what it moves if it was
    done, and what the client knows: acked (200), refused (4xx), unknown (no answer or 5xx)."""

    kind: str
    ident: str
    legs: list[tuple[str, str, Decimal]]  # (account, asset, delta) if done; completed at the end for some kinds
    state: str = "refused"
    signer: str = ""  # account whose key sent it
    query: str = ""  # the signed query text of the first attempt (for a replay)
    params: dict = field(default_factory=dict)  # its parameters (to send the client id again)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def answered(self, answer) -> None:
        if answer.status == 200:
            self.state = "acked"
        elif answer.unknown and self.state != "acked":
            self.state = "unknown"
