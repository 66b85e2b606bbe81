"""The chaos run's report: each fault's window (answers during and after, recovery), nginx's access
log, what the stack's programs printed, and the whole."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from harness.chaos.records import CLIENT_RATE, CLIENTS, LISTENERS, RECOVERY_SECONDS, Check, Fault, tally
from harness.ports import HOST


def nginx_statuses(run_dir: Path) -> Counter:
    counts: Counter = Counter()
    log = run_dir / "access.log"
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split('"')
            if len(parts) > 2 and parts[2].split():
                counts[parts[2].split()[0]] += 1
    return counts


def stack_log_findings(path: Path) -> tuple[Counter, list[str], list[str]]:
    """What the stack's programs printed (`HH:MM:SS name | line`, harness/loglines.py): counts
    of tracebacks and notable messages; each exit supervisord saw (its `exited: NAME (...)` lines), with
    the program's last lines before it; the first tracebacks, those of unexpected errors (the -1000
    answers) first (for a defect report)."""
    counts: Counter = Counter()
    exits: list[str] = []
    unexpected: list[str] = []
    others: list[str] = []
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for i, line in enumerate(lines):
        text = line.partition(" | ")[2]
        for marker in ("Traceback", "Unexpected error", "Database unavailable", "Exception inside application"):
            if marker in text:
                counts[marker] += 1
        exited = _EXITED.search(line) if not text else None
        if exited:
            counts["program exited (supervisord)"] += 1
            name = exited.group(1)
            window = lines[max(0, i - 400) : i]
            before = [earlier for earlier in window if earlier.partition(" | ")[0].split()[-1:] == [name]]
            last = [] if "SIGKILL" in exited.group(2) else before[-8:]  # SIGKILL: ours
            exits.append("\n".join([line, *("      " + b for b in last)]))
        if "Unexpected error" in text and len(unexpected) < 2:
            unexpected.append("\n".join(lines[i : i + 40]))
        elif "Traceback" in text and len(others) < 2:
            others.append("\n".join(lines[max(0, i - 1) : i + 30]))
    return counts, exits, (unexpected or others)


_EXITED = re.compile(r" exited: (\S+) \((.*)\)$")


# --- the report ---------------------------------------------------------------------------------------


def fault_report(chaos, index: int, fault: Fault) -> None:
    rel = chaos.record.rel
    following = chaos.record.faults[index + 1].start if index + 1 < len(chaos.record.faults) else chaos.record.load_end
    fault.until = following
    during = [a for a in chaos.record.answers if fault.start <= a.ended <= fault.end]
    after = [a for a in chaos.record.answers if fault.end < a.ended <= following]
    transfers_during = [a for a in during if a.kind == "transfer"]
    transfers_after = [a for a in after if a.kind == "transfer"]
    first_ok = min((a.ended for a in transfers_after if a.status == 200), default=None)
    recovery = first_ok - fault.end if first_ok is not None else None
    lines = fault.lines
    lines.append(f"[{index + 1}] {fault.name}: " + "; ".join(fault.steps))
    lines.append(
        f"    window {rel(fault.start)} .. {rel(fault.end)} ({fault.end - fault.start:.1f} s); "
        f"after it until {rel(following)}"
    )
    lines.append(f"    transfers during: {tally(transfers_during)}")
    lines.append(f"    transfers after:  {tally(transfers_after)}")
    lines.append(
        "    first 200 after the end: "
        + (f"{recovery:.2f} s" if recovery is not None else f"NONE within {following - fault.end:.0f} s")
    )
    for kind in ("withdrawal", "universal", "collection", "listenkey"):
        seen_during = [a for a in during if a.kind == kind]
        seen_after = [a for a in after if a.kind == kind]
        if seen_during or seen_after:
            lines.append(f"    {kind}s: during {tally(seen_during)}, after {tally(seen_after)}")
    if fault.in_flight:
        lines.append(
            f"    in flight at the kill: withdrawals {fault.in_flight.get('withdrawals')}, "
            f"collections {fault.in_flight.get('collections')}; all final "
            + (f"{fault.settled_after:.1f} s after the kill" if fault.settled_after is not None else "NEVER")
        )
        if fault.settled_after is None:
            fault.problems.append(f"{fault.name}: the work in flight at the kill never became final")
    closed = [s for s in chaos.record.segments if s.closed is not None and fault.start <= s.closed <= following]
    if closed:
        reopened = [
            min((t.opened for t in chaos.record.segments if t.slot == s.slot and t.opened > s.closed), default=None)
            for s in closed
        ]
        waits = [r - s.closed for r, s in zip(reopened, closed, strict=True) if r is not None]
        lines.append(
            f"    websockets closed by the server: {len(closed)} "
            f"{dict(Counter(s.closed_with for s in closed))} at {', '.join(rel(s.closed) for s in closed)}; "
            f"connected again after {', '.join(f'{w:.1f} s' for w in waits) or '-'}"
        )
    else:
        lines.append("    websockets: none closed by the server")
    breaking = [a for a in during + after if a.breaks_a_rule]
    if breaking:
        fault.problems.append(f"{fault.name}: {len(breaking)} answers breaking the rules {tally(breaking)}")
    if recovery is None:
        fault.problems.append(f"{fault.name}: no transfer succeeded after the fault")
    elif recovery > RECOVERY_SECONDS:
        fault.problems.append(f"{fault.name}: the first 200 came {recovery:.0f} s after the fault")
    lines.append("    broken rules: " + ("; ".join(fault.problems) if fault.problems else "none"))


def build_report(chaos, checks: list[Check], problems: list[str], extra: list[str]) -> str:
    stack, layout = chaos.stack, chaos.stack.layout
    transfers = [a for a in chaos.record.answers if a.kind == "transfer"]
    span = max(chaos.record.load_end - chaos.record.t0, 1e-9)
    lines = [
        f"chaos: seed {chaos.seed}; faults in the order {', '.join(f.name for f in chaos.record.faults)}",
        f"stack: nginx {HOST}:{stack.port} -> granian {layout.rest_workers} x {layout.rest_threads}, "
        f"Daphne x {len(layout.ws_ports)}, Celery worker ({layout.celery_concurrency}) and beat; private "
        f"PostgreSQL {stack.pg.version} (port {stack.pg.port}, max_connections {stack.pg.max_connections}) and Redis "
        f"(port {stack.redis.port}, appendonly yes)",
        f"load: {CLIENTS} transfer clients ({CLIENTS * CLIENT_RATE:.0f}/s offered), {LISTENERS} websockets on the "
        f"peer's listenKey, a withdrawal every second and a universal transfer + collection every 3 s, "
        f"for {span:.0f} s: {len(transfers)} transfers, "
        f"{sum(a.status == 200 for a in transfers) / span:.0f}/s answered 200",
        "",
    ]
    for fault in chaos.record.faults:
        lines.extend(fault.lines)
    lines.append("")
    lines.append("final checks:")
    for check in checks:
        lines.append(f"  {'ok    ' if check.ok else 'BROKEN'} {check.name}: {check.detail}")
    lines.extend(extra)
    lines.append("")
    if problems:
        lines.append("RESULT: BROKEN")
        lines.extend(f"  PROBLEM: {p}" for p in problems)
    else:
        lines.append("RESULT: ok, no rule broken")
    return "\n".join(lines)
