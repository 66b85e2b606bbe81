"""`run()`: services, stack, load, faults, checks, report; and the command line
(`python -m harness.chaos`)."""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness.chaos.checks import (
    check_collections,
    check_ledger,
    check_transfers,
    check_websockets,
    check_withdrawals,
)
from harness.chaos.driver import Chaos
from harness.chaos.records import ChaosResult, Check, tally
from harness.chaos.report import build_report, fault_report, nginx_statuses, stack_log_findings
from harness.private import PrivateStack


def run(seed: int | None = None, *, out=None, keep: bool = False) -> ChaosResult:
    """Everything: services, stack, load, faults, checks. The report is printed to `out` (stdout)
    and returned with the result."""
    out = out or sys.stdout
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 10**6)
    base = Path(tempfile.mkdtemp(prefix="chaos-"))
    chaos = Chaos(seed, out, PrivateStack(base))
    checks: list[Check] = []
    problems: list[str] = []
    extra: list[str] = []
    every_restart: dict[str, int] = {}
    try:
        chaos.start()
        asyncio.run(chaos.drive())
        for index, fault in enumerate(chaos.record.faults):
            fault_report(chaos, index, fault)
            problems.extend(fault.problems)
        elsewhere = [
            a
            for a in chaos.record.answers
            if a.breaks_a_rule and not any(f.start <= a.ended <= f.until for f in chaos.record.faults)
        ]
        if elsewhere:
            problems.append(f"{len(elsewhere)} answers breaking the rules outside the faults {tally(elsewhere)}")
        checks = [
            check_ledger(chaos),
            check_transfers(chaos),
            check_withdrawals(chaos),
            check_collections(chaos),
            check_websockets(chaos),
        ]
        problems.extend(f"{c.name}: {c.detail.splitlines()[0]}" for c in checks if not c.ok)
        every_restart = chaos.stack.supervisor.restarts()  # from its log, which goes with the run's directory
        restarts = {name: n for name, n in every_restart.items() if n}
        by_themselves = {name: n - (name == "worker") for name, n in restarts.items() if n - (name == "worker")}
        extra.append(
            f"  supervisord restarts: {restarts or 'none'} (the worker once after its SIGKILL)"
            + (f"; NOTE: exited by themselves (the times below): {by_themselves}" if by_themselves else "")
        )
    except BaseException:
        out.write(f"chaos: the run itself failed; its files are in {base}\n")
        raise
    finally:
        chaos.stop()
    time.sleep(2.5)  # nginx flushes its buffered access log every 2 s (it has stopped by now)
    statuses = nginx_statuses(chaos.stack.run_dir)
    five = {s: n for s, n in statuses.items() if s.startswith("5")}
    extra.append(f"  nginx access log: {sum(statuses.values())} requests, 5xx {five or 'none'}")
    if any(s != "503" for s in five):
        problems.append(f"nginx logged 5xx other than 503: {five}")
    counts, exits, blocks = stack_log_findings(chaos.stack.run_dir / "stack.log")
    extra.append(f"  stack log (clock {chaos.record.t0_clock} = +0.0 s): {dict(counts) or 'nothing notable'}")
    extra.extend("    " + line for exit_ in exits for line in exit_.splitlines())
    if blocks and problems:
        extra.append("  first tracebacks in the stack log:")
        extra.extend("    " + line for block in blocks for line in [*block.splitlines(), "    ---"])
    report = build_report(chaos, checks, problems, extra)
    log_dir = None
    if problems or keep:
        log_dir = base
        for name in ("pg/data", "redis/appendonlydir"):
            shutil.rmtree(base / name, ignore_errors=True)
        report += f"\nlogs kept in {base} (stack/stack.log, stack/access.log, pg/postgres.log, redis/redis.log)"
    else:
        shutil.rmtree(base, ignore_errors=True)
    out.write("\n" + report + "\n")
    out.flush()
    return ChaosResult(
        seed,
        chaos.record.faults,
        checks,
        problems,
        report,
        chaos.record.answers,
        chaos.record.segments,
        every_restart,
        log_dir,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="Faults under load against the full stack (harness/chaos).")
    parser.add_argument("--seed", type=int, default=None, help="fault order and timing (default: random, printed)")
    parser.add_argument("--keep", action="store_true", help="keep the logs in the temporary directory")
    options = parser.parse_args()
    return 0 if run(options.seed, keep=options.keep).ok else 1
