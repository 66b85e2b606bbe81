"""Dependencies point one way (docs/architecture.md).

`exchange/` is parts, each one line of docs/architecture.md (`PARTS`): the runtime helpers, the
gateway (`exchange/api`, which imports no app), the back office's staff tools, the platform app
(business status, label "exchange"), the back office's read side (`exchange/dashboard`, above every
app), and the wiring. Each part and each app may import only the parts listed for it in `MAY_USE`,
which is the edges the code has (no allowance goes unused) and docs/architecture.md's table: the
apps use the low parts (runtime, gateway, staff tools, platform) and `accounts`; the one edge
between the other apps is subaccounts -> wallet; no app imports `streams` to publish; only the
dashboard and the wiring see every app. Around the product sit the operator tools (`scripts/`), the
harness that runs the stack (`harness/`), the benchmarks (`bench/`) and the tests (`tests/`):
nothing of the product imports them; scripts, bench and tests may use every app; each may use of
the others only what `OUTER_MAY_USE` lists (the benches and the tests the harness); the
harness drives the product as processes (HTTP, websocket, SQL, manage.py) and imports of it exactly
the modules of `HARNESS_IMPORTS`. This test parses every module of the project (the apps, scripts,
harness, bench, tests and manage.py) with `ast` (imports inside functions and under
`if TYPE_CHECKING:` included: a lazy import is still a dependency and still closes a cycle, it only
hides it until run time) and fails on:

- an import cycle between modules;
- an upward import (see `_upward`).

No Django, no database: it reads source files only.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from tests.support.import_graph import component, cycles

ROOT = Path(__file__).resolve().parent.parent
APPS = ("accounts", "wallet", "streams", "exchange", "convert", "subaccounts")
# The layers around the product, outermost last: operator tools, the harness, benchmarks, tests.
OUTER = ("scripts", "harness", "bench", "tests")
# What each of them may import of the others (of the product: every module, but the harness).
OUTER_MAY_USE: dict[str, frozenset[str]] = {
    "scripts": frozenset(),
    "harness": frozenset(),
    "bench": frozenset({"harness"}),  # the benches start the stack as `make run` does
    "tests": frozenset({"harness"}),  # no test imports a bench; scripts/ holds no Python module
}
# The product's modules the harness imports (module -> who, and why): exactly these, each used. The
# harness starts the stack and drives it as processes, over HTTP, websocket, SQL and manage.py;
# docs/architecture.md names the same list.
HARNESS_IMPORTS = {
    # harness.services, harness.private, harness.lab.fault: an emptied Redis declared to have seen no
    # signature (the replay memory's bookkeeping keys, a module without Django)
    "exchange.api.replay_memory": "the replay memory's keys",
    # harness.lab.bench_accounts (a process of its own on the lab stack's database): the host fault
    # run's funded accounts and their keys, through the ledger and the key service
    "accounts": "bench_accounts: `from accounts import ledger, services`",
    "accounts.ledger": "bench_accounts: the funding posting",
    "accounts.ledger.models": "bench_accounts: BusinessType",
    "accounts.models": "bench_accounts: User, LedgerAccount, SystemRole",
    "accounts.services": "bench_accounts: api_key_create",
}

# The project wiring: settings, URL confs, ASGI/WSGI entry points, the Celery app, the project
# package itself (exchange/__init__.py loads the Celery app) and manage.py necessarily name every
# app. They may import anything; nothing imports them (except each other).
WIRING = (
    "exchange.urls",
    "exchange.api_urls",
    "exchange.asgi",
    "exchange.wsgi",
    "exchange.celery",
    "exchange.settings",  # and every module under it
)
# The parts of exchange/ below the wiring, by package (a module belongs to the longest that names it).
PARTS = {
    "exchange.runtime": "runtime",  # process-wide helpers every app may use (outage log, caches, beat)
    "exchange.api": "gateway",  # the request gateway: depends on no app (the key store is registered)
    "exchange.backoffice": "backoffice",  # staff tools: audit trail, four eyes, roles, admin parts
    "exchange.platform": "platform",  # the service's own small domain (app label "exchange")
    "exchange.dashboard": "dashboard",  # the back office's read side: dashboard, customer page, site
}
# What each part or app imports besides itself: exactly the edges the code has (a new edge is a
# decision, made here and in docs/architecture.md's table, which tests below hold to this one; an
# allowance no import uses any more fails too). The one edge between apps: subaccounts -> wallet.
_APPS = frozenset({"accounts", "wallet", "convert", "subaccounts", "streams"})
MAY_USE: dict[str, frozenset[str]] = {
    "runtime": frozenset(),
    "gateway": frozenset({"runtime"}),
    "backoffice": frozenset({"gateway"}),
    "platform": frozenset({"runtime", "gateway", "backoffice"}),
    "accounts": frozenset({"runtime", "gateway", "backoffice"}),
    "wallet": frozenset({"runtime", "gateway", "backoffice", "accounts"}),
    "convert": frozenset({"runtime", "gateway", "backoffice", "platform", "accounts"}),
    "subaccounts": frozenset({"runtime", "gateway", "backoffice", "accounts", "wallet"}),
    "streams": frozenset({"runtime", "gateway", "accounts"}),
    "dashboard": frozenset(
        {"runtime", "gateway", "platform", "accounts", "wallet", "convert", "subaccounts", "streams"}
    ),
}

# Imports allowed to close a cycle, as (importer, imported). It is empty and should stay so: a
# service hands work to its task through a hook its tasks module registers (wallet/settlement.py,
# subaccounts/collection.py), a type is declared below both of its users.
ALLOWED_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_python(path: Path) -> bool:
    """A Python source: a `.py` file, or an extensionless script whose first line runs Python."""
    if path.suffix == ".py":
        return True
    if path.suffix or not path.is_file():
        return False
    with path.open("rb") as source:
        first = source.readline()
    return first.startswith(b"#!") and b"python" in first


def _project_modules() -> dict[str, Path]:
    modules = {"manage": ROOT / "manage.py"}
    for top in (*APPS, *OUTER):
        for path in sorted((ROOT / top).rglob("*")):
            if "__pycache__" not in path.parts and _is_python(path):
                modules[_module_name(path)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` loads (the longest prefix that is a module, from the project root:
    nothing puts another directory on sys.path), or None if external."""
    candidate = name
    while candidate:
        if candidate in modules:
            return candidate
        candidate = candidate.rpartition(".")[0]
    return None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported by `module`, anywhere in its file (functions and `if TYPE_CHECKING:`
    blocks included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            found.add(source)
            # `from package import submodule` imports the submodule.
            found.update(f"{source}.{alias.name}" for alias in node.names)
    resolved = {_resolve(name, modules) for name in found}
    resolved.discard(None)
    resolved.discard(module)
    return resolved  # type: ignore[return-value]


def _graph() -> dict[str, set[str]]:
    """module -> the project modules it imports. Imports under `if TYPE_CHECKING:` count like the
    others: they never run, but the two modules still cannot be read (or typed) one without the
    other, and `typing.get_type_hints` would run them."""
    modules = _project_modules()
    return {module: _imports(module, path, modules) for module, path in modules.items()}


def _app(module: str) -> str:
    return module.partition(".")[0]


def _layer(module: str) -> int:
    """0 for the product (the apps and manage.py), then 1, 2, 3, 4 for scripts, harness, bench and
    tests (OUTER's order)."""
    top = _app(module)
    return OUTER.index(top) + 1 if top in OUTER else 0


def _is_wiring(module: str) -> bool:
    return module in ("exchange", "manage") or any(module == w or module.startswith(w + ".") for w in WIRING)


def _part(module: str) -> str:
    """The part of the project `module` belongs to: "wiring", a part of exchange/ (PARTS), or its
    top-level package (an app, scripts, bench, tests)."""
    if _is_wiring(module):
        return "wiring"
    named = [prefix for prefix in PARTS if module == prefix or module.startswith(prefix + ".")]
    return PARTS[max(named, key=len)] if named else _app(module)


_WHY = {
    "wiring": "only the project wiring imports the project wiring",
    "streams": "no app imports streams (streams listens; it is never called to publish)",
    "dashboard": "only the wiring imports the back office's read side (it sits above every app)",
    "accounts": "accounts is above the exchange parts and below every other app",
}


def _upward(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    src_top, dst_top = _app(importer), _app(imported)
    if _layer(imported) and src_top != dst_top:
        if not _layer(importer):
            return f"nothing of the product imports {dst_top}/ (it runs around the product)"
        if dst_top not in OUTER_MAY_USE[src_top]:
            return f"{src_top}/ may use of the tools around the product only {sorted(OUTER_MAY_USE[src_top])}"
        return None
    if src_top == "harness" and not _layer(imported) and imported not in HARNESS_IMPORTS:
        return "the harness drives the product as processes: it imports only HARNESS_IMPORTS of it"
    if _layer(importer):  # scripts, bench and tests run the project: every app and the wiring
        return None
    src, dst = _part(importer), _part(imported)
    if src == dst or src == "wiring":
        return None
    if dst in MAY_USE.get(src, frozenset()):
        return None
    return _WHY.get(dst, f"{src} may use only {', '.join(sorted(MAY_USE[src])) or 'itself'}")


def _cycle_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph less the edges allowed to close a cycle (none)."""
    return {m: {d for d in deps if (m, d) not in ALLOWED_CYCLE_EDGES} for m, deps in graph.items()}


def test_graph_sees_the_project():
    graph = _graph()
    assert "accounts.models" in graph
    assert "exchange.api.views" in graph
    assert "exchange.api.auth" in graph["exchange.api.views"]
    assert _part("exchange.api.ratelimit.bans") == "gateway"
    assert _part("exchange.dashboard.views") == "dashboard"
    assert _part("exchange.settings.base") == _part("exchange") == "wiring"
    # scripts, bench (extensionless scripts and the modules they import from bench/) and tests
    assert "wallet.settlement" in graph["tests.wallet.test_withdraw_life"]
    assert "bench._bench" in graph["bench.transfers"]
    assert "harness.make_run" in graph["bench.transfers"]
    assert "exchange.api.replay_memory" in graph["harness.services"]
    # the programs the harness starts are modules: their imports are seen (no program in a string)
    assert "accounts.ledger" in graph["harness.lab.bench_accounts"]
    assert "harness.lab.bench_accounts" in graph
    assert "harness.demo_world" in graph
    assert "accounts.ledger" in graph["bench.programs.transfer_accounts"]  # the benches' programs too
    assert "streams.relay" in graph["bench.programs.stream_publisher"]


def test_no_import_cycles():
    graph = _graph()
    edges = _cycle_edges(graph)
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(
        "  " + " -> ".join(cycle) + f"   (modules in this cycle: {', '.join(component(edges, cycle[0]))})"
        for cycle in found
    )


def test_no_upward_imports():
    graph = _graph()
    bad = [
        f"  {importer} -> {imported}: {reason}"
        for importer, deps in sorted(graph.items())
        for imported in sorted(deps)
        if (reason := _upward(importer, imported))
    ]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_gateway_imports_no_app():
    """issue 27, item 1: the key look-up is registered into the gateway (accounts/apps.py), the
    ledger's refusals are answered through answer_as; the gateway names none of the apps."""
    graph = _graph()
    gateway = [m for m in graph if _part(m) == "gateway"]
    assert "exchange.api.auth" in gateway
    named = sorted(
        {(m, d) for m in gateway for d in graph[m] if _part(d) != "gateway"}
        - {(m, d) for m in gateway for d in graph[m] if _part(d) == "runtime"}
    )
    assert not named, f"the gateway imports: {named}"


def test_every_module_of_exchange_is_in_a_part():
    """No loose modules at exchange/'s root beyond the wiring: every module of exchange/ is in a part
    that docs/architecture.md states in one line (or is the wiring)."""
    loose = [m for m in _graph() if _app(m) == "exchange" and _part(m) == "exchange"]
    assert not loose, f"modules of exchange/ in no part: {loose}"


def test_no_cycle_is_allowed():
    assert not ALLOWED_CYCLE_EDGES


def test_allow_list_is_still_needed():
    graph = _graph()
    stale = [edge for edge in sorted(ALLOWED_CYCLE_EDGES) if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"allowed edges that no longer exist: {stale}"


def _is_sys_path(func: ast.expr) -> bool:
    """`sys.path.<insert|append|extend>`."""
    return (
        isinstance(func, ast.Attribute)
        and func.attr in ("insert", "append", "extend")
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "path"
        and isinstance(func.value.value, ast.Name)
        and func.value.value.id == "sys"
    )


def test_nothing_edits_sys_path():
    """Every program runs from the project root with its packages importable as they are (`python -m
    bench.NAME`, `python -m harness...`, `manage.py`): a module that puts a directory on
    sys.path hides an import from this test."""
    edits = [
        f"  {module}:{node.lineno}"
        for module, path in sorted(_project_modules().items())
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Call) and _is_sys_path(node.func)
    ]
    assert not edits, "modules that edit sys.path:\n" + "\n".join(edits)


def _program_strings(path: Path) -> list[int]:
    """Lines where `"-c"` in a command (a list, or the arguments of a call such as
    create_subprocess_exec) is followed by a program: a name or attribute (a constant holding code)
    or a string that is not a number (pgbench's `-c 32` is a client count, `-c str(conf)` a file)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        items = node.elts if isinstance(node, ast.List | ast.Tuple) else node.args if isinstance(node, ast.Call) else []
        for flag, given in itertools.pairwise(items):
            if not (isinstance(flag, ast.Constant) and flag.value == "-c"):
                continue
            code = isinstance(given, ast.Constant) and isinstance(given.value, str) and not given.value.isdigit()
            if code or isinstance(given, ast.Name | ast.Attribute):
                found.append(given.lineno)
    return found


def test_no_program_in_a_string_in_the_harness_or_the_benches():
    """The programs the harness and the benches start are modules (`python -m harness...`,
    `python -m bench.programs.NAME`), never `python -c` strings (nor `manage.py shell -c`): ruff and
    the import graph above read a module, not the code inside a string (issue 36, item 1)."""
    strings = [
        f"  {module}:{line}"
        for module, path in sorted(_project_modules().items())
        if module.startswith(("harness.", "bench."))
        for line in _program_strings(path)
    ]
    assert not strings, "programs in a string:\n" + "\n".join(strings)


def _part_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """part -> the other parts (and apps) its modules import, below the wiring and the tools around
    the product."""
    edges: dict[str, set[str]] = {}
    for importer, deps in graph.items():
        if _layer(importer) or _part(importer) == "wiring":
            continue
        for imported in deps:
            src, dst = _part(importer), _part(imported)
            if src != dst and not _layer(imported):
                edges.setdefault(src, set()).add(dst)
    return edges


def test_every_allowance_is_an_import_the_code_has():
    """MAY_USE is the picture of the real edges: an allowance nothing uses is stale."""
    edges = _part_edges(_graph())
    stale = sorted((src, dst) for src, allowed in MAY_USE.items() for dst in allowed if dst not in edges.get(src, ()))
    assert not stale, f"MAY_USE allows imports no module makes (remove them): {stale}"


def test_the_only_edge_between_the_apps_besides_accounts_is_subaccounts_to_wallet():
    edges = _part_edges(_graph())
    between = sorted(
        (src, dst) for src in _APPS for dst in edges.get(src, ()) if dst in _APPS and "accounts" not in (src, dst)
    )
    assert between == [("subaccounts", "wallet")]


def _documented_edges() -> dict[str, frozenset[str]]:
    """docs/architecture.md's table "| `part` | imports |": part -> the parts its row names."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("<!-- MAY_USE -->")[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = frozenset(re.findall(r"`([a-z]+)`", cells[1]))
        elif rows and not line.startswith("|"):
            break
    return rows


def test_the_architecture_docs_table_is_may_use():
    assert _documented_edges() == MAY_USE


def test_nothing_of_the_product_imports_the_harness():
    """issue 36, item 1: the harness is tooling production does not run. No module of the product
    (the apps, exchange/, the wiring, manage.py) imports it, and none names it in a string (an
    INSTALLED_APPS entry, a dotted path to load): production's settings install no harness app."""
    graph = _graph()
    imports = sorted((m, d) for m, deps in graph.items() if not _layer(m) for d in deps if _app(d) == "harness")
    assert not imports, f"the product imports the harness: {imports}"
    modules = _project_modules()
    named = sorted(
        f"{module}:{node.lineno} {node.value!r}"
        for module, path in modules.items()
        if not _layer(module)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "harness" or node.value.startswith("harness."))
    )
    assert not named, "the product names the harness:\n  " + "\n  ".join(named)


def test_the_harness_imports_exactly_its_list_of_the_product():
    """The harness drives the product as processes; of its code it imports only HARNESS_IMPORTS (an
    import beyond fails in test_no_upward_imports), and every entry is an import it still makes."""
    graph = _graph()
    used = {d for m, deps in graph.items() if _app(m) == "harness" for d in deps if not _layer(d)}
    listed = set(HARNESS_IMPORTS)
    assert used == listed, f"not imported any more: {sorted(listed - used)}; not listed: {sorted(used - listed)}"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    undocumented = [module for module in HARNESS_IMPORTS if f"`{module}`" not in doc]
    assert not undocumented, f"docs/architecture.md does not name the harness's imports {undocumented}"


def test_the_tools_around_the_product_use_each_other_only_as_listed():
    """bench -> harness, tests -> harness: each allowance an import the code has."""
    graph = _graph()
    edges = {
        (_app(m), _app(d)) for m, deps in graph.items() for d in deps if _layer(m) and _layer(d) and _app(m) != _app(d)
    }
    allowed = {(src, dst) for src, dsts in OUTER_MAY_USE.items() for dst in dsts}
    assert edges == allowed
