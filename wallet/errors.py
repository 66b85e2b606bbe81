"""Wallet refusals, as the spec's codes (see docs/wallet.md for the table)."""

from exchange.api.errors import BadRequest, InvalidParameter, NoPermission


def unknown(name: str) -> InvalidParameter:
    return InvalidParameter(name)


def invalid(name: str, why: str) -> InvalidParameter:
    return InvalidParameter(msg=f"Parameter '{name}' is not valid: {why}.")


def suspended(what: str) -> BadRequest:
    return BadRequest(msg=f"{what} is suspended.")


def not_allowed(why: str) -> NoPermission:
    return NoPermission(msg=why)


def limit_exceeded(period: str, which: str) -> BadRequest:
    return BadRequest(msg=f"The {period} {which} limit would be exceeded.")


def duplicate(name: str) -> BadRequest:
    return BadRequest(msg=f"Duplicate {name}: it was already used on this account.")
