"""Every program the tests call, or the code they run calls, comes from a Debian package that
`make test` installs (scripts/packages/test.txt; the lab's code may also use scripts/packages/lab.txt,
which `make lab-test` installs): a fresh machine's `make test` does not skip or fail for a missing
binary (issue 35: haproxy, installed by the lab's script only, failed a clean clone's `make test`).

The programs are found in the source, without running it: `shutil.which("x")`, a subprocess's
argument list that starts with a literal (`["runuser", ...]`, `create_subprocess_exec("x", ...)`),
a Debian path (`/usr/sbin/x`, `/usr/lib/postgresql/...`) and `<a bin directory> / "x"`. Each program
found must be in PROGRAMS, with the package that installs it; a program not there fails the test
(add it, with its package, and the package to a list)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "scripts" / "packages"
# The code the test run reaches: the apps, the project (exchange/), the harness (harness/), the
# tests. bench/ is `make bench`'s (its wrk is optional: it says so and goes on).
SOURCES = ("accounts", "convert", "exchange", "harness", "streams", "subaccounts", "wallet", "tests", "manage.py")
# The lab's code (`make lab-test`): its programs may come from lab.txt too.
LAB_CODE = ("harness/lab/", "harness/simulation/lab.py")

ESSENTIAL = "(Debian's essential packages)"
VENV = "(the virtualenv: requirements.txt, or the lab's Patroni virtualenv)"
INTERPRETER = "(the Python that made the virtualenv)"
NOT_A_PROGRAM = "(a file, not a program)"

# program -> the Debian package that installs it (or where it comes from otherwise)
PROGRAMS = {
    "postgres": "postgresql",
    "initdb": "postgresql",
    "pg_ctl": "postgresql",
    "pg_basebackup": "postgresql",
    "pg_isready": "postgresql",
    "psql": "postgresql",
    "pg_ctlcluster": "postgresql",
    "pg_lsclusters": "postgresql",
    "pg_createcluster": "postgresql",
    "redis-server": "redis-server",
    "redis-cli": "redis-server",  # redis-tools, which redis-server depends on
    "redis-sentinel": "redis-sentinel",
    "nginx": "nginx-light",
    "chromium": "chromium",
    "haproxy": "haproxy",
    "etcd": "etcd-server",
    "ip": "iproute2",
    "runuser": ESSENTIAL,  # util-linux
    "sh": ESSENTIAL,  # dash
    "bash": ESSENTIAL,  # bash (Essential: yes)
    "setpriv": ESSENTIAL,  # util-linux
    "make": "make",
    "python3": INTERPRETER,
    "python": VENV,
    "daphne": VENV,
    "granian": VENV,
    "celery": VENV,
    "supervisord": VENV,
    "supervisorctl": VENV,
    "patroni": VENV,
    "policy-rc.d": NOT_A_PROGRAM,  # written by scripts/install-packages.sh and harness/nginx.py
}
# Programs the machine has before `make test` can run at all (it is a Makefile: make is there).
PRESENT = {"make"}

SPAWNERS = {"run", "Popen", "check_call", "check_output", "call", "create_subprocess_exec", "execv", "execvp"}
SPAWNING_MODULES = {"subprocess", "asyncio", "os"}
DEBIAN_PATH = re.compile(r"^/(?:usr/)?s?bin/([^/\s]+)$")
POSTGRES_PATH = re.compile(r"^/usr/lib/postgresql(?:/|$)")


def package_list(*names: str) -> set[str]:
    packages = set()
    for name in names:
        for line in (PACKAGES / name).read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                packages.add(words[0])
    return packages


def _literal_head(node: ast.expr) -> str | None:
    """The first element of a list or tuple literal, when it is a string."""
    if isinstance(node, ast.List | ast.Tuple) and node.elts:
        first = node.elts[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _spawns(func: ast.expr) -> bool:
    """subprocess.run(...), asyncio.create_subprocess_exec(...), os.execvp(...), Popen(...): not a
    function of the project's that happens to be called `run`."""
    if isinstance(func, ast.Attribute):
        return func.attr in SPAWNERS and isinstance(func.value, ast.Name) and func.value.id in SPAWNING_MODULES
    return isinstance(func, ast.Name) and func.id in SPAWNERS - {"run", "call"}


def _argv_like(node: ast.List) -> bool:
    """["program", "--option", ...]: a literal program name followed by a literal option."""
    head, second = _literal_head(node), node.elts[1]
    return (
        head is not None
        and re.fullmatch(r"[A-Za-z/][\w./+-]*", head) is not None
        and not head.startswith("-")
        and isinstance(second, ast.Constant)
        and isinstance(second.value, str)
        and second.value.startswith("-")
    )


def programs_in(tree: ast.AST) -> set[tuple[str, int]]:
    """The programs a module calls: (name, line)."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name == "which" and node.args and isinstance(node.args[0], ast.Constant):
                found.add((str(node.args[0].value), node.lineno))
            elif _spawns(node.func) and node.args:
                head = _literal_head(node.args[0])
                first = node.args[0]
                if head is None and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    head = first.value.split()[0] if first.value.split() else None
                if head is not None and not head.startswith("-"):
                    found.add((Path(head).name, node.lineno))
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id.lower() in {"prefix", "args", "argv", "cmd", "command"}
            for target in node.targets
        ):
            for value in (node.value, getattr(node.value, "body", None), getattr(node.value, "orelse", None)):
                head = _literal_head(value) if value is not None else None
                if head is not None and not head.startswith("-"):
                    found.add((Path(head).name, node.lineno))
        elif isinstance(node, ast.List) and len(node.elts) > 1 and _argv_like(node):
            found.add((Path(_literal_head(node)).name, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if match := DEBIAN_PATH.match(node.value):
                found.add((match[1], node.lineno))
            elif POSTGRES_PATH.match(node.value):
                found.add(("postgres", node.lineno))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and POSTGRES_PATH.match(str(first.value)):
                found.add(("postgres", node.lineno))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if (
                isinstance(right, ast.Constant)
                and isinstance(right.value, str)
                and "bin" in ast.unparse(node.left).lower()
            ):
                found.add((right.value, node.lineno))
    return found


def calls() -> list[tuple[str, str, int]]:
    """(program, file, line) of every call found in SOURCES."""
    found = []
    for source in SOURCES:
        path = ROOT / source
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            for program, line in programs_in(ast.parse(file.read_text(), filename=relative)):
                found.append((program, relative, line))
    return sorted(found)


def test_every_program_called_comes_from_a_listed_package():
    test_packages = package_list("test.txt")
    lab_packages = test_packages | package_list("lab.txt")
    problems = []
    seen = set()
    for program, file, line in calls():
        seen.add(program)
        where = f"{file}:{line}"
        if program not in PROGRAMS:
            problems.append(f"{where}: {program!r} is not in PROGRAMS (tests/test_packages.py): which package?")
            continue
        package = PROGRAMS[program]
        if package.startswith("(") or program in PRESENT:
            continue
        allowed = lab_packages if file.startswith(LAB_CODE) else test_packages
        if package not in allowed:
            lists = "scripts/packages/test.txt" + (" or lab.txt" if file.startswith(LAB_CODE) else "")
            problems.append(f"{where}: {program!r} comes from {package}, which {lists} does not list")
    assert not problems, "\n".join(problems)
    # The scan does find what the suite is known to call (a scanner that finds nothing passes too).
    assert {"haproxy", "nginx", "chromium", "redis-server", "postgres", "pg_basebackup"} <= seen, seen


def test_the_scan_finds_each_form_of_call():
    source = """
import shutil, subprocess, asyncio
shutil.which("alpha")
subprocess.run(["beta", "-x"])
asyncio.create_subprocess_exec("gamma", "--flag")
prefix = ["delta", "-u", "postgres"] if root else []
def as_user():
    return ["eta", "--reuid=postgres", "--"]
path = "/usr/sbin/epsilon"
data = f"/usr/lib/postgresql/{major}/bin"
tool = self.bin / "zeta"
subprocess.run([sys.executable, "-c", "x"])
"""
    found = {program for program, _ in programs_in(ast.parse(source))}
    assert found == {"alpha", "beta", "gamma", "delta", "eta", "epsilon", "postgres", "zeta"}


def test_every_package_a_program_needs_is_listed_once():
    test_packages, lab_packages = package_list("test.txt"), package_list("lab.txt")
    assert not test_packages & lab_packages, "a package in both lists: keep it in test.txt"
    needed = {package for package in PROGRAMS.values() if not package.startswith("(")} - {"make"}
    assert needed <= test_packages | lab_packages, needed - test_packages - lab_packages
