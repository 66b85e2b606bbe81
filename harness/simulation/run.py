"""`run()`: the world, the drive, the end checks and the report; the command line
(`python -m harness.simulation --seed N`)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from harness.chaos.records import Check
from harness.chaos.report import nginx_statuses, stack_log_findings
from harness.services import manage
from harness.simulation.driver import Simulation
from harness.simulation.plan import digest


@dataclass
class SimulationResult:
    seed: int
    digest: str
    ok: bool
    report: str
    operations: dict
    faults: list
    checks: list
    violations: list


def run(
    seed: int, minutes: float, *, customers: int = 4, out=None, keep: bool = False, lab: bool = False
) -> SimulationResult:
    """`lab`: on the HA lab, with its faults (simulation/lab.py); the lab must be up."""
    out = out or sys.stdout
    base = Path(tempfile.mkdtemp(prefix="simulate-"))
    if lab:
        from harness.simulation.lab import LabSimulation

        sim = LabSimulation(seed, minutes, customers, out)
    else:
        sim = Simulation(seed, minutes, customers, out)
    checks = []
    try:
        sim.start(base)
        asyncio.run(sim.drive())
        ledger = manage(sim.stack.env, "ledger_check")
        text = (ledger.stdout + ledger.stderr).strip()
        checks = sim.end_checks(
            Check(
                "ledger_check", ledger.returncode == 0, text.splitlines()[-1] if text else f"exit {ledger.returncode}"
            )
        )
    except BaseException:
        out.write(f"simulate: the run itself failed; its files are in {base}\n")
        raise
    finally:
        sim.stop()
    record = sim.record
    problems = [f"{c.name}: {c.detail.splitlines()[0]}" for c in checks if not c.ok] + record.violations
    lines = [
        f"simulate: seed {seed}, {minutes:g} minutes, {customers} customers; "
        f"schedule {digest(sim.ops, sim.fault_plan)}",
        "operations (what the clients saw):",
    ]
    for kind in sorted(record.outcomes):
        lines.append(f"  {kind}: {sum(record.outcomes[kind].values())} {dict(record.outcomes[kind])}")
    lines.append(
        "faults injected: "
        + (", ".join(f"{n} x{c}" for n, c in Counter(f["name"] for f in record.faults).items()) or "none")
    )
    for i, fault in enumerate(record.faults, start=1):
        lines.append(
            f"  [{i}] +{fault['start'] - record.t0:.1f} s {fault['name']} ({fault['end'] - fault['start']:.1f} s): "
            + "; ".join(fault["steps"])
        )
    states = Counter(f"{m.kind} {m.state}" for m in record.moves.values())
    lines.append(f"client ids by outcome: {dict(sorted(states.items()))}")
    lines.append(f"deposits sent on the chain: {len(record.deposits)}")
    lines.append("end checks:")
    for check in checks:
        lines.append(f"  {'ok    ' if check.ok else 'BROKEN'} {check.name}: {check.detail}")
    if (sim.stack.run_dir / "access.log").exists():  # not on the lab's app hosts: HAProxy logs no requests
        statuses = nginx_statuses(sim.stack.run_dir)
        lines.append(
            f"nginx access log: {sum(statuses.values())} requests, "
            f"5xx {({s: n for s, n in statuses.items() if s.startswith('5')}) or 'none'}"
        )
    counts, _, blocks = stack_log_findings(sim.stack_log)
    lines.append(f"stack log: {dict(counts) or 'nothing notable'}")
    if problems:
        lines.append("RESULT: BROKEN")
        lines.extend(f"  PROBLEM: {p}" for p in problems)
        lines.extend("    " + line for block in blocks for line in [*block.splitlines(), "    ---"])
    else:
        lines.append(
            "RESULT: ok - the ledger balances, every balance is what the clients were told, every stream complete"
        )
    if problems or keep:
        for name in ("pg/data", "redis/appendonlydir"):
            shutil.rmtree(base / name, ignore_errors=True)
        lines.append(f"logs kept in {base} (stack/stack.log, stack/access.log, pg/postgres.log, redis/redis.log)")
    else:
        shutil.rmtree(base, ignore_errors=True)
    report = "\n".join(lines)
    out.write("\n" + report + "\n")
    out.flush()
    operations = {kind: dict(counter) for kind, counter in record.outcomes.items()}
    return SimulationResult(
        seed, digest(sim.ops, sim.fault_plan), not problems, report, operations, record.faults, checks, problems
    )


def main(argv: list[str] | None = None, out=None) -> int:
    """The command line: exit status 0 when every end check passes, 1 when one fails, 2 for bad
    arguments or, with `--lab`, a lab that is not up."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.simulation",
        description="Run the seeded simulation (random customers through every flow, random faults, end checks).",
    )
    parser.add_argument("--seed", type=int, required=True, help="The same seed gives the same schedule.")
    parser.add_argument("--minutes", type=float, default=1.0, help="Length of the load (default 1).")
    parser.add_argument("--customers", type=int, default=4, help="Customers, each with a sub-account (default 4).")
    parser.add_argument("--keep", action="store_true", help="Keep the logs in the run's temporary directory.")
    parser.add_argument(
        "--lab",
        action="store_true",
        help="On the HA lab (python -m harness.lab up first), with its faults drawn by the seed.",
    )
    options = parser.parse_args(argv)
    if options.minutes <= 0 or options.customers < 1:
        parser.error("--minutes must be positive and --customers at least 1")
    out = out or sys.stdout
    if options.lab:
        from harness.simulation.lab import lab_is_up

        if not lab_is_up():
            out.write("simulate: the HA lab is not up: python -m harness.lab up\n")
            return 2
    result = run(
        options.seed, options.minutes, customers=options.customers, out=out, keep=options.keep, lab=options.lab
    )
    if not result.ok:
        out.write(f"simulate: seed {options.seed}: {len(result.violations)} problem(s), see above\n")
    return 0 if result.ok else 1
