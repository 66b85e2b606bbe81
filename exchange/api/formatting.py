"""Amounts leave the service as decimal strings, never floats."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal


def amount(value: Decimal, places: int = 8) -> str:
    """`value` with at least `places` decimals (more only when the value has them): "1.50000000"."""
    value = Decimal(value)
    exponent = value.normalize().as_tuple().exponent
    digits = max(places, -exponent if isinstance(exponent, int) and exponent < 0 else 0)
    return f"{value:.{digits}f}"


def millis(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment else 0
