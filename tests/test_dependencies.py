"""Dependencies point one way (docs: DESIGN section 1).

Everything may use `exchange` and `accounts`; `streams` reads `accounts`; no app imports `streams`
to publish; `accounts` never imports an app above it. This test parses every module of the
project's apps with `ast` (imports inside functions included: a lazy import is still a dependency
and still closes a cycle, it only hides it until run time) and fails on:

- an import cycle between modules;
- an upward import (see `_upward`).

No Django, no database: it reads source files only.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("accounts", "wallet", "streams", "exchange", "convert", "subaccounts")

# The project wiring: settings, URL confs, ASGI/WSGI entry points and the Celery app necessarily
# name every app. They may import anything; nothing imports them (except each other).
WIRING = (
    "exchange.urls",
    "exchange.api_urls",
    "exchange.asgi",
    "exchange.wsgi",
    "exchange.celery",
    "exchange.settings",  # and every module under it
)
# The back office's read side (the operations dashboard and the customer page) sits on top of every
# app: it reads their models and selectors, and only the wiring (exchange.urls) and its own app import it.
BACK_OFFICE = ("exchange.dashboard",)

# Function-level imports allowed to close a cycle, as (importer, imported). Keep this list as short
# as possible, and say why next to each entry.
ALLOWED_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset(
    {
        # Celery's usual pair: tasks are thin and call services; a service enqueues its task on
        # commit, importing it inside the function (wallet/tasks.py needs wallet.services at load).
        ("wallet.services", "wallet.tasks"),
        ("subaccounts.services", "subaccounts.tasks"),  # the same pair: fund collection
    }
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    modules = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            modules[_module_name(path)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` loads (the longest prefix that is a module), or None if external."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: annotations only, never run."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                hidden.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return hidden


def _imports(module: str, path: Path, modules: dict[str, Path], *, annotations: bool) -> set[str]:
    """Project modules imported by `module`, anywhere in its file (functions included); with
    `annotations`, also those imported under `if TYPE_CHECKING:` only."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hidden = set() if annotations else _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
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


def _graph(*, annotations: bool = False) -> dict[str, set[str]]:
    """module -> the project modules it imports. Imports under `if TYPE_CHECKING:` never run, so
    they cannot close a cycle; they still count as dependencies for the direction rules."""
    modules = _project_modules()
    return {module: _imports(module, path, modules, annotations=annotations) for module, path in modules.items()}


def _app(module: str) -> str:
    return module.partition(".")[0]


def _is_wiring(module: str) -> bool:
    return any(module == w or module.startswith(w + ".") for w in WIRING)


def _upward(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    if _is_wiring(importer) or importer.startswith(tuple(f"{m}." for m in BACK_OFFICE)):
        return None
    src, dst = _app(importer), _app(imported)
    if src == dst:
        return None
    if _is_wiring(imported):
        return "only the project wiring imports the project wiring"
    if dst == "streams":
        return "no app imports streams (streams listens; it is never called to publish)"
    if src == "accounts" and dst in ("wallet", "streams", "convert", "subaccounts"):
        return "accounts is below every other app"
    if src == "exchange" and dst != "accounts":
        return "exchange may use only accounts"
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component with more than one module."""
    edges = {m: {d for d in deps if (m, d) not in ALLOWED_CYCLE_EDGES} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    for root in sorted(edges):
        if root in index:
            continue
        # Iterative Tarjan, so deep graphs do not hit the recursion limit.
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # Shortest path from start back to start inside the component.
        previous: dict[str, str] = {}
        frontier = [start]
        seen = {start}
        end = None
        while frontier and end is None:
            following = []
            for node in frontier:
                for child in sorted(edges[node] & members):
                    if child == start:
                        end = node
                        break
                    if child not in seen:
                        seen.add(child)
                        previous[child] = node
                        following.append(child)
                if end is not None:
                    break
            frontier = following
        path = [start]
        node = end
        while node != start:
            path.append(node)
            node = previous[node]
        path.append(start)
        cycles.append([start, *reversed(path[1:-1]), start] if len(path) > 2 else [start, start])
    return cycles


def _component(graph: dict[str, set[str]], start: str) -> list[str]:
    """The modules on some cycle through `start` (reachable from it and reaching it back)."""

    def reach(edges: dict[str, set[str]]) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for child in edges.get(todo.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    edges = {m: {d for d in deps if (m, d) not in ALLOWED_CYCLE_EDGES} for m, deps in graph.items()}
    reverse: dict[str, set[str]] = {}
    for m, deps in edges.items():
        for d in deps:
            reverse.setdefault(d, set()).add(m)
    return sorted(reach(edges) & reach(reverse))


def test_graph_sees_the_project():
    graph = _graph()
    assert "accounts.models" in graph
    assert "exchange.api.views" in graph
    assert "accounts.keyring" in graph["exchange.api.views"]


def test_no_import_cycles():
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        "  " + " -> ".join(cycle) + f"   (modules in this cycle: {', '.join(_component(graph, cycle[0]))})"
        for cycle in cycles
    )


def test_no_upward_imports():
    graph = _graph(annotations=True)
    bad = [
        f"  {importer} -> {imported}: {reason}"
        for importer, deps in sorted(graph.items())
        for imported in sorted(deps)
        if (reason := _upward(importer, imported))
    ]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_allow_list_is_still_needed():
    graph = _graph()
    stale = [edge for edge in ALLOWED_CYCLE_EDGES if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"allowed cycle edges that no longer exist: {stale}"
