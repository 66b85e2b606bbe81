"""docs/architecture.md's layout table names every module of the service (issue 27, item 8): a
module added without its line fails here. A module is named by its path, by its directory's brace
form (`exchange/dashboard/{activity,views}.py`), or by `{a,b}/name.py` across apps."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("exchange", "accounts", "wallet", "convert", "subaccounts", "streams", "scripts", "harness")


def _named(doc: str) -> set[str]:
    named = set()
    for cell in re.findall(r"`([^`]+\.py)`", doc):
        expanded = [cell]
        while any("{" in c for c in expanded):
            grown = []
            for c in expanded:
                match = re.search(r"\{([^}]*)\}", c)
                if match is None:
                    grown.append(c)
                    continue
                grown += [c[: match.start()] + part + c[match.end() :] for part in match.group(1).split(",")]
            expanded = grown
        named.update(expanded)
    return named


def test_every_module_has_its_line():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = _named(doc)
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative or (path.name == "__init__.py" and path.stat().st_size < 200):
                continue
            if relative in named:
                continue
            siblings = [n for n in named if n.startswith(".../")]
            if any(relative.endswith(n[3:]) for n in siblings):
                continue
            missing.append(relative)
    assert not missing, f"modules without a line in docs/architecture.md's layout table: {missing}"
