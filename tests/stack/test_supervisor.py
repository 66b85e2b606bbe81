"""What the stack needs of supervisord (harness/supervisor.py), shown on two small programs:
they start and listen, each one's output is named, one killed (SIGKILL to its process group, as the
fault tests do) is started again with another pid and counted, and a stop (SIGTERM, as Ctrl-C)
leaves no process behind."""

from __future__ import annotations

import os
import signal
import sys
import time

from harness.ports import free_port, listening
from harness.programs import Program
from harness.supervisor import Supervisor


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _program(name: str, port: int) -> Program:
    serve = (
        f"print('{name} up', flush=True); import http.server as h; "
        f"h.test(h.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')"
    )
    return Program(name, [sys.executable, "-c", serve], port=port)


def test_supervisord_starts_restarts_a_killed_program_and_stops_everything(tmp_path):
    programs = [_program("one", free_port()), _program("two", free_port())]
    supervisor = Supervisor(programs, dict(os.environ), tmp_path / "run", log=tmp_path / "stack.log")
    supervisor.start(timeout=60)
    try:
        assert all(listening(p.port) for p in programs)
        first = supervisor.pid("one")
        other = supervisor.pid("two")
        os.killpg(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while supervisor.pid("one") in (0, first) or not listening(programs[0].port):
            assert time.monotonic() < deadline, "supervisord did not start the killed program again"
            time.sleep(0.1)
        assert supervisor.pid("two") == other  # the other one untouched
        assert supervisor.restarts() == {"one": 1, "two": 0}
        again = supervisor.pid("one")
    finally:
        supervisor.stop()
    assert supervisor.proc.returncode == 0
    assert not any(_alive(pid) for pid in (again, other))
    assert not any(listening(p.port) for p in programs)
    log = (tmp_path / "stack.log").read_text()
    assert " one | one up" in log  # each program's output under its name
    assert " two | two up" in log
