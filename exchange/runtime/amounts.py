"""The one precision of every amount column (NUMERIC(36, 18)), without Django: the ledger's models
declare their columns with it and the gateway (exchange/api/params.py) bounds every DECIMAL
parameter by it, so that no amount a request carries can fail to fit the column it is written to."""

from __future__ import annotations

from decimal import Decimal

AMOUNT_DIGITS = 36
AMOUNT_PLACES = 18
QUANTUM = Decimal(1).scaleb(-AMOUNT_PLACES)
# The largest value the columns hold: 18 nines, the point, 18 nines (built from its digits: Decimal
# arithmetic would round it to the context's 28 digits).
MAX_AMOUNT = Decimal((0, (9,) * AMOUNT_DIGITS, -AMOUNT_PLACES))


def decimal_places(value: Decimal) -> int:
    """The decimal places `value` needs (1.50 needs 1), counted exactly: `normalize()` rounds to
    the context's 28 digits, so it would count 100000000000000000.00000000000000001 as 0."""
    _, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int) or not any(digits):  # infinity, NaN or zero: no places to count
        return 0
    zeros = 0
    while zeros < len(digits) and digits[len(digits) - 1 - zeros] == 0:
        zeros += 1
    return max(0, -(exponent + zeros))
