"""Assertions the tests share: the error envelope, the ledger check, a balance."""

from __future__ import annotations

from decimal import Decimal

from accounts.ledger.check import CheckResult, ledger_check
from accounts.models import Asset, Balance, User


def assert_error(response, code: int, status: int | None = None, msg_contains: str | None = None) -> dict:
    """The envelope and the code (and the HTTP status, and a part of the message, when given)."""
    body = response.json()
    assert set(body) == {"code", "msg"}, body
    assert body["code"] == code, body
    assert isinstance(body["msg"], str)
    assert body["msg"]
    if status is not None:
        assert response.status_code == status, (response.status_code, body)
    if msg_contains is not None:
        assert msg_contains in body["msg"], body
    return body


def assert_ledger_balanced() -> CheckResult:
    """The ledger check: every balance equals its journal, every posting and the book sum to zero."""
    result = ledger_check()
    assert result.ok, result.report()
    return result


def assert_balance(user: User, asset: Asset | str, free: Decimal | str | int, locked: Decimal | str | int = 0) -> None:
    """`user`'s balance of `asset` (no row: nothing) is exactly `free` and `locked`."""
    code = asset.code if isinstance(asset, Asset) else asset
    row = Balance.objects.filter(account=user, asset__code=code).first()
    actual = (row.free, row.locked) if row else (Decimal(0), Decimal(0))
    assert actual == (Decimal(free), Decimal(locked)), f"{user} {code}: (free, locked) = {actual}"
