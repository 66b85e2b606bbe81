"""Money is Decimal: no module that computes amounts calls `float(`, and no model declares a
FloatField (ruff's TID251 bans the field by name; `float(` is a builtin, which ruff's banned-api
cannot see, so this walks the code)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where amounts are computed, parsed or rendered. convert/ and subaccounts/ join as they grow.
MONEY_PATHS = (
    "accounts/ledger",
    "accounts/limits.py",
    "accounts/policy.py",
    "accounts/presenters.py",
    "accounts/selectors.py",
    "wallet",
    "convert",
    "subaccounts",
    "exchange/api/params.py",
    "exchange/api/formatting.py",
)


def _modules() -> list[Path]:
    found = []
    for entry in MONEY_PATHS:
        path = ROOT / entry
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.rglob("*.py") if "migrations" not in p.parts)
    return found


def float_uses(source: str) -> list[int]:
    """Line numbers of `float(...)` calls and of `FloatField` names in `source`."""

    def is_float(node: ast.AST) -> bool:
        calls_float = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
        names_field = (isinstance(node, ast.Attribute) and node.attr == "FloatField") or (
            isinstance(node, ast.Name) and node.id == "FloatField"
        )
        return calls_float or names_field

    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if is_float(node))


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_money_modules_never_use_float(module: Path):
    assert float_uses(module.read_text()) == [], f"{module.relative_to(ROOT)}: use Decimal, never float"


def test_the_walk_finds_what_it_looks_for():
    assert float_uses("x = float('1.5')\ny = models.FloatField()\n") == [1, 2]
    assert float_uses("from decimal import Decimal\nx = Decimal('1.5')\nisinstance(x, float)\n") == []
