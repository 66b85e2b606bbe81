"""`python -m harness.lab test` (what `make lab-test` runs, under the lab's lock): the lab brought
up, every fault in turn on it (each from a healthy cluster), hostfault, a short `python -m harness.simulation
--lab`, the lab always brought down (also on a failure, Ctrl-C or SIGTERM), then one table: each run's
PASS/FAIL, the window it measured and the seconds it took. Exit status 1 if any run failed.

Each run is its own process (`python -m harness.lab fault NAME`, ...): its output goes through as
it comes, one run's crash is that run's FAIL, and the window is read from the lines it prints.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from harness.lab import cluster
from harness.layout import ROOT

FAULTS = ("pg-kill", "pg-cut", "pg-disk", "redis-kill", "sentinel-cut", "rolling")
SIMULATION = ("-m", "harness.simulation", "--lab", "--seed", "1", "--minutes", "1")
HEALTHY_SECONDS = 180.0

# The window each kind of run reports, read from its own lines.
_FAULT_BACK = re.compile(r"accepted again at \+(\d+\.\d) s after the fault")
_FAULT_NONE = "no transfer after the fault was refused or unanswered"
_BEAT = re.compile(r"first by app2 \+(\d+\.\d) s after")
_SIM_RESULT = re.compile(r"^result:? *(\w+)", re.IGNORECASE | re.MULTILINE)


@dataclass
class Result:
    name: str
    ok: bool
    window: str
    seconds: float


class Stop(Exception):
    """SIGTERM, as Ctrl-C: end the run in hand, bring the lab down."""


def _terminate(_signum, _frame):
    raise Stop


def window_of(name: str, text: str) -> str:
    if name == "hostfault":
        found = _BEAT.search(text)
        return f"beat taken over +{found.group(1)} s" if found else "-"
    if name == "simulate":
        found = _SIM_RESULT.search(text)
        return f"result {found.group(1)}" if found else "-"
    if _FAULT_NONE in text:
        return "no refusal"
    found = _FAULT_BACK.search(text)
    if found:
        return f"writes back +{found.group(1)} s"
    return "NOT back" if "NOT accepted again" in text else "-"


def run_one(name: str, argv: list[str]) -> Result:
    """One run as a child process, its output passed through and kept."""
    began = time.monotonic()
    sys.stdout.write(f"\n=== lab-test: {name} ({time.strftime('%H:%M:%S')})\n")
    sys.stdout.flush()
    if not cluster.wait_healthy(HEALTHY_SECONDS):
        sys.stdout.write(f"=== lab-test: {name}: not healthy after {HEALTHY_SECONDS:.0f} s: {cluster.status()}\n")
        return Result(name, False, "lab not healthy", time.monotonic() - began)
    child = subprocess.Popen(  # noqa: S603 - this interpreter, the project's own commands
        [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        child.wait()
    except BaseException:
        child.send_signal(signal.SIGINT)  # as Ctrl-C: it brings its own stack down; the lab is ours
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
        raise
    text = "".join(lines)
    return Result(name, child.returncode == 0, window_of(name, text), time.monotonic() - began)


def table(results: list[Result], up_seconds: float, total: float) -> str:
    rows = [("run", "result", "window", "seconds")]
    if up_seconds:
        rows.append(("lab up", "ok", "-", f"{up_seconds:.0f}"))
    rows += [(r.name, "PASS" if r.ok else "FAIL", r.window, f"{r.seconds:.0f}") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    out.insert(1, "-+-".join("-" * w for w in widths))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out.append(f"{sum(r.ok for r in results)} of {len(results)} passed in {total:.0f} s; load average now {load}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.lab test")
    parser.add_argument(
        "--only", nargs="*", choices=[*FAULTS, "hostfault", "simulate"], help="these runs, in this order (repeats too)"
    )
    args = parser.parse_args(argv)
    steps = {name: ["-m", "harness.lab", "fault", name] for name in FAULTS}
    steps["hostfault"] = ["-m", "harness.lab", "hostfault"]
    steps["simulate"] = list(SIMULATION)
    plan = [(name, steps[name]) for name in (args.only or steps)]
    signal.signal(signal.SIGTERM, _terminate)
    began = time.monotonic()
    results: list[Result] = []
    up_seconds = 0.0
    if (cluster.RUN_DIR / "supervisord.pid").exists():
        # We hold the lab's lock: a lab still up is one an interrupted run left behind.
        sys.stdout.write("lab-test: a lab left up by an earlier run: bringing it down first\n")
        cluster.down()
    try:
        cluster.up()
        up_seconds = time.monotonic() - began
        sys.stdout.write(f"lab-test: the lab is up ({up_seconds:.0f} s): {cluster.status()}\n")
        for name, command in plan:
            results.append(run_one(name, command))
    except (KeyboardInterrupt, Stop):
        results.append(Result("interrupted", False, "-", 0.0))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - `up` failing is a result; the lab still goes down
        results.append(Result("lab up" if not up_seconds else "lab-test", False, str(exc)[:60], 0.0))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the way down is not cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.down()
    sys.stdout.write("\n=== lab-test summary\n" + table(results, up_seconds, time.monotonic() - began) + "\n")
    return 0 if results and all(r.ok for r in results) else 1
