"""The stack's programs under supervisord (the `supervisor` package, requirements.txt): this module
writes its configuration and starts, asks and stops it. supervisord starts the programs, starts
again one that exits (at once; one that fails within a second of its start after a pause that grows
by a second per try), stops them all on SIGINT or SIGTERM (each program's process group, nginx with
SIGQUIT, the others with SIGTERM: they finish what is in flight) and names the output of each
(harness/loglines.py). What supervisord does not do is kept here: wait until the programs
listen, and count the restarts (from its log).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shlex
import signal
import socket
import subprocess
import sys
import xmlrpc.client
from pathlib import Path

from harness.layout import ROOT
from harness.ports import wait_for_port
from harness.programs import Program

LOG_LISTENER = Path(__file__).with_name("loglines.py")
START_RETRIES = 100  # a program that keeps failing at start is given up after this many tries


def _value(text: str) -> str:
    """A value in supervisord's configuration: `%` is its expansion character."""
    return text.replace("%", "%%")


def _environment(env: dict[str, str]) -> str:
    return ",".join(f'{k}="{_value(v)}"' for k, v in env.items())


def supervisord_conf(programs: list[Program], run_dir: Path, *, python: str = sys.executable) -> str:
    width = max(len(p.name) for p in programs)
    lines = [
        "; Written by harness/supervisor.py at every start; edit that file, not this one.",
        "[supervisord]",
        "nodaemon=true",
        f"logfile={_value(str(run_dir / 'supervisord.log'))}",
        "logfile_maxbytes=0",
        f"pidfile={_value(str(run_dir / 'supervisord.pid'))}",
        f"childlogdir={_value(str(run_dir))}",
        *(["user=root"] if os.geteuid() == 0 else []),  # as root: stay root, and say so (no warning)
        "",
        "[unix_http_server]",
        f"file={_value(str(run_dir / 'supervisor.sock'))}",
        "chmod=0700",
        "",
        "[supervisorctl]",  # `supervisorctl -c <run dir>/supervisord.conf status` (docs/operations.md)
        f"serverurl=unix://{_value(str(run_dir / 'supervisor.sock'))}",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[eventlistener:loglines]",
        f"command={_value(shlex.join([python, str(LOG_LISTENER), str(width)]))}",
        "events=PROCESS_LOG",
        "buffer_size=10000",
        "priority=1",
        "autorestart=true",
        "stderr_logfile=/dev/stdout",
        "stderr_logfile_maxbytes=0",
    ]
    for order, program in enumerate(programs, start=1):
        lines += [
            "",
            f"[program:{program.name}]",
            f"command={_value(shlex.join(program.args))}",
            f"directory={_value(str(ROOT))}",
            # The front last: it stops first (supervisord stops in the reverse order).
            f"priority={10 * order}",
            "autostart=true",
            "autorestart=true",
            "startsecs=1",
            f"startretries={START_RETRIES}",
            f"stopsignal={'QUIT' if program.name == 'nginx' else 'TERM'}",
            "stopwaitsecs=20",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            "stdout_logfile=NONE",
            "stdout_events_enabled=true",
        ]
        if program.env:
            lines.append(f"environment={_environment(program.env)}")
    return "\n".join(lines) + "\n"


class Supervisor:
    """supervisord over `programs` with the environment `env`, its files in `run_dir`; its output
    (the programs' named lines and its own) to the file `log`, or to this process's output."""

    def __init__(self, programs: list[Program], env: dict[str, str], run_dir: Path, *, log: Path | None = None) -> None:
        self.programs = programs
        self.env = env
        self.run_dir = run_dir
        self.log = log
        self.conf = run_dir / "supervisord.conf"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> None:
        """supervisord up and every program with a port listening on it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(supervisord_conf(self.programs, self.run_dir))
        (self.run_dir / "supervisord.log").unlink(missing_ok=True)
        # Append mode: supervisord's own lines and the listener's (/dev/stdout) share the file.
        out = self.log.open("ab") if self.log is not None else None
        try:
            self.proc = subprocess.Popen(  # noqa: S603 - supervisord on our own configuration
                [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
            )
        finally:
            if out is not None:
                out.close()
        log = str(self.log or self.run_dir / "supervisord.log")
        for program in self.programs:
            if program.port is not None:
                wait_for_port(program.port, timeout, proc=self.proc, log=log)

    def rpc(self):
        transport = _UnixTransport(str(self.run_dir / "supervisor.sock"))
        return xmlrpc.client.ServerProxy("http://supervisord", transport=transport).supervisor

    def pid(self, name: str) -> int:
        """The running process of program `name` (0 while it is not running)."""
        return int(self.rpc().getProcessInfo(name)["pid"])

    def restarts(self) -> dict[str, int]:
        """How often supervisord started each program again (its log's `spawned:` lines, less the first)."""
        path = self.run_dir / "supervisord.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return {p.name: max(0, text.count(f"spawned: '{p.name}' ") - 1) for p in self.programs}

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    def wait(self) -> int:
        return self.proc.wait() if self.proc is not None else 0

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to supervisord: it stops every program (the front first) and exits."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over supervisord's unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def make_connection(self, host):
        path = self.path

        class Connection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(10)
                self.sock.connect(path)

        return Connection("localhost")
