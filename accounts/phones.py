"""Phone numbers as transfer addresses: one rule of comparison, used everywhere a number is stored,
looked up or kept unique (docs/security.md, "Identifiers and ownership").

A number is compared NORMALISED: its spaces, dashes and parentheses removed, nothing else changed
(a leading `+` is kept; `+63 (917) 000-0002` and `+639170000002` are the same number, `639170000002`
is another). The database keeps the normalised value unique (accounts.User's constraint
`user_phone_normalised_unique`, an index on the same expression), so two accounts can never answer
to one number, whatever wrote the rows; a transfer's recipient is found by the same expression
(accounts.selectors.transfer_parties), which that index serves.

A number staff or a service stores is normalised first and must then be E.164: `+` and 7 to 15
digits, the first not 0 (what a transfer's `target_address` must be to be read as a number)."""

from __future__ import annotations

import re

from django.db.models import F, Value
from django.db.models.functions import Replace

# Removed before numbers are compared. The SQL below and `phone_normalised` must agree exactly.
SEPARATORS = (" ", "-", "(", ")")
E164 = re.compile(r"\+[1-9][0-9]{6,14}")
NOT_E164 = (
    "A phone number is + and 7 to 15 digits (E.164), e.g. +639171234567; spaces, dashes and brackets are ignored."
)


def normalise_phone(raw: str | None) -> str | None:
    """`raw` with its separators removed; None for no number (None or nothing left)."""
    if raw is None:
        return None
    value = raw
    for separator in SEPARATORS:
        value = value.replace(separator, "")
    return value or None


def is_e164(value: str | None) -> bool:
    return value is not None and E164.fullmatch(value) is not None


def phone_normalised(field: str = "phone"):
    """The database expression of the normalised number of column `field` (for the unique index and
    the look-ups, which must use the same expression for the index to serve them)."""
    expression = F(field)
    for separator in SEPARATORS:
        expression = Replace(expression, Value(separator), Value(""))
    return expression


def phone_normalised_sql(column: str) -> str:
    """The same expression as raw SQL over `column` (accounts.selectors.transfer_parties). The
    separators are this module's constants, never input."""
    sql = column
    for separator in SEPARATORS:
        sql = f"REPLACE({sql}, '{separator}', '')"
    return sql
