"""Ports and waiting: a free port, a free block of ports, until something listens (every user of the
harness: `make run`, the benches, the fault tests, the chaos runner and the simulation)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_block(size: int = 4) -> int:
    """A free port whose next `size - 1` are free too (nginx, REST, websocket...)."""
    for _ in range(200):
        port = free_port()
        if port + size < 65535 and all(port_free(port + i) for i in range(size)):
            return port
    raise RuntimeError("no block of free ports")


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(step)


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


def wait_for_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None, log: str = "") -> None:
    """Until something listens on `port`; fails early when `proc` exits first (with the tail of the
    file `log`, when given)."""
    deadline = time.monotonic() + timeout
    while not listening(port):
        exited = proc is not None and proc.poll() is not None
        if exited or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if exited else f"nothing listening after {timeout:.0f} s"
            tail = ""
            if log:
                with contextlib.suppress(OSError), open(log, errors="replace") as out:
                    tail = ":\n" + out.read()[-3000:]
            raise RuntimeError(f"port {port}: {why}{tail}")
        time.sleep(0.1)
