"""Every command README.md shows works (issue 35, item 5): its ```sh blocks run with bash, in order,
in one shell (a newcomer pastes them into one terminal: the signed request's KEY and SECRET serve
the websocket and ccxt examples), against the server `make run` starts, and each block exits 0.

The two make commands themselves are not run: the first block must be exactly `make run` and
`make test`, and the server is the one `make run` starts in its embedded mode (the daphne command
line of the Makefile's run target, read from the Makefile) on a free port over a fresh SQLite file
after migrate and the demo world. The README's `127.0.0.1:8000` becomes that port; nothing else is
changed. Nothing leaves localhost."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.stack import ROOT, free_port, manage, process, stack_env, wait_for_port

pytestmark = pytest.mark.timeout(600)

README = ROOT / "README.md"
BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.S | re.M)
MAKE_COMMANDS = ["make run", "make test"]


def readme_blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def make_run_server_args(port: int) -> list[str]:
    """The embedded server of the Makefile's run target, as it starts it (`exec .venv/bin/daphne ...`)."""
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^run:.*?(?=^\S)", makefile, re.S | re.M)
    assert target, "the Makefile has no run target"
    line = re.search(r"exec \$\(VENV\)/bin/(daphne [^;\n]*)", target.group(0))
    assert line, f"the run target starts no daphne:\n{target.group(0)}"
    args = line.group(1).replace("$(PORT)", str(port)).split()
    return [str(ROOT / ".venv" / "bin" / args[0]), *args[1:]]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """`make run` without configuration: migrate, the demo world, Daphne on a free port; the
    environment a newcomer's second terminal has (no REDIS_URL, the same DATABASE_URL)."""
    database = tmp_path_factory.mktemp("readme") / "exchange.sqlite3"
    env = stack_env(
        drop=("REDIS_URL", "REDIS_SENTINELS", "DATABASE_REPLICA_URL", "TEST_REDIS_DBS"),
        DATABASE_URL=f"sqlite:///{database}",
        LOG_LEVEL="WARNING",
    )
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "demo")
    port = free_port()
    with process(make_run_server_args(port), env, "readme-daphne") as server:
        wait_for_port(port, server)
        yield port, env, server


def test_the_first_block_is_the_two_commands():
    lines = [line.split("#")[0].strip() for line in readme_blocks()[0].splitlines()]
    assert [line for line in lines if line] == MAKE_COMMANDS


def test_every_readme_block_runs(embedded, tmp_path):
    port, env, server = embedded
    blocks = readme_blocks()[1:]
    assert len(blocks) >= 4, "the README shows the ping, the signed request, the websocket and the admin"
    script = ["set -eo pipefail"]
    for number, block in enumerate(blocks, start=1):
        path = tmp_path / f"block{number}.sh"
        path.write_text(block.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
        script += [f"echo '=== block {number}' $(date +%s.%N)", f"source {path}"]
    run = subprocess.run(  # noqa: S603 - bash running the README's own blocks
        ["bash", "-c", "\n".join(script)],  # noqa: S607
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    out = run.stdout
    failed = out.rpartition("=== block ")[2].partition(" ")[0]  # the last block started
    assert run.returncode == 0, (
        f"README block {failed} exited {run.returncode}:\n{blocks[int(failed) - 1] if failed else ''}\n"
        f"--- stdout\n{out[-3000:]}\n--- stderr\n{run.stderr[-3000:]}\n--- server\n{server.tail()}"
    )
    assert out.count("=== block") == len(blocks)
    assert '"balances":[{"asset":"BTC"' in out, out  # the signed request: 200 with the balances
    assert "-1002" not in out, out  # not unauthorized
    assert "-1022" not in out, out  # not a bad signature
    assert '"e": "balanceUpdate"' in out, out  # the websocket: the deposit's events
    assert '"e": "outboundAccountPosition"' in out, out
    assert "'BTC': " in out, out  # ccxt's fetch_balance
    assert out.rstrip().endswith("200"), out  # the admin's login page
