"""docs/configuration.md's table names every environment variable the service's code reads, and
nothing else (issue 35, item 4): a setting added without its line, or a line left behind when its
setting goes, fails here.

"The service's code" is exchange/ (the settings), the apps and harness/ (the stack, the lab); the benchmarks'
`BENCH_*` knobs (bench/) and the test run's own variables (tests/) are not settings of the service.
A read is a call whose first argument is an upper-case name: django-environ's `env.str("NAME", ...)`
(and `.int`, `.bool`, `.float`, `.list`, `.db`, ...), `os.environ.get("NAME")`, `os.environ["NAME"]`,
`os.getenv("NAME")`, a layout's `env.get("NAME")` over the process's environment, and the stack's
`_int_env(env, "NAME", ...)`. No Django, no database: it reads source files only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ("exchange", "accounts", "wallet", "convert", "subaccounts", "streams", "harness")
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"[A-Z][A-Z0-9_]*[A-Z0-9]")
# Names a module passes on to its children or removes from their environment without reading them.
_WRITES = ("setdefault", "pop")


def _name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
        return node.value
    return None


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, or a name/attribute called env or environ (a dict of the environment)."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("environ", "env") or (node.attr == "environ" and isinstance(node.value, ast.Name))
    return isinstance(node, ast.Name) and node.id in ("env", "environ")


def _read_name(node: ast.AST) -> str | None:
    """The variable `node` reads from the environment, if it is such a read."""
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return _name(node.slice)
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id == "_int_env":  # _int_env(env, "NAME", default)
        return _name(node.args[1]) if len(node.args) >= 2 else None
    direct = isinstance(func, ast.Name) and func.id == "env"  # env("NAME")
    getenv = isinstance(func, ast.Attribute) and func.attr == "getenv"
    method = isinstance(func, ast.Attribute) and _is_environ(func.value) and func.attr not in _WRITES
    return _name(node.args[0]) if direct or getenv or method else None


def _reads(tree: ast.AST) -> set[str]:
    return {name for node in ast.walk(tree) if (name := _read_name(node))}


def settings_read() -> dict[str, list[str]]:
    """Every environment variable the service's code reads -> the files that read it."""
    where: dict[str, list[str]] = {}
    for top in SERVICE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            for name in _reads(ast.parse(path.read_text(), filename=str(path))):
                where.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return where


def settings_documented() -> set[str]:
    """The names in the first cell of docs/configuration.md's table rows (`A` / `B` cells name two)."""
    names: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", line.split("|")[1]))
    return names


def test_the_extraction_sees_the_kinds_of_read():
    read = settings_read()
    assert "exchange/settings/base.py" in read["WITHDRAWAL_FOUR_EYES_ABOVE"]  # env.str
    assert "exchange/settings/base.py" in read["RATE_LIMIT_STORAGE_URL"]  # env.str over two lines
    assert "harness/layout.py" in read["STACK_WS_PROCESSES"]  # _int_env
    assert "harness/layout.py" in read["STACK_BIND"]  # env.get
    assert "harness/lab/topology.py" in read["LAB_DIR"]  # os.environ.get
    assert "DJANGO_SETTINGS_MODULE" in read  # os.environ.get in the demo command
    assert "PYTHONUNBUFFERED" not in read  # setdefault: given to the stack's programs, not read


def test_every_setting_read_is_documented():
    missing = sorted(set(settings_read()) - settings_documented())
    assert not missing, f"read from the environment but not in docs/configuration.md's table: {missing}"


def test_every_setting_documented_is_read():
    stale = sorted(settings_documented() - set(settings_read()))
    assert not stale, f"in docs/configuration.md's table but read nowhere in the service's code: {stale}"
