"""The load and the bank check every lab fault shares (`python -m harness.lab fault NAME`).

The load is the chaos run's (harness/chaos: signed transfer clients with client ids, a
withdrawal a second with a universal transfer and a collection every third, websockets on the peer's
listenKey that connect again and resync) plus the peer converting PHP <-> USDT; the stack is
`make run`'s, in the machine's own namespace, pointed at the lab (for `rolling`: on the application
hosts behind HAProxy, ON_APP_HOSTS). The bank check at the end: the
chaos checks (ledger_check, every transfer / withdrawal / collection once, every websocket event once
and in order across the reconnects), every accepted conversion once, the peer's balances on
GET /openapi/v1/account equal to what its client computed from the answers it was given, and no
5xx other than 503 -1001.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

from harness.chaos.checks import (
    check_collections,
    check_ledger,
    check_transfers,
    check_websockets,
    check_withdrawals,
)
from harness.chaos.driver import Chaos
from harness.chaos.records import TRANSFER, Answer, Check, Fault, now, tally
from harness.lab import cluster, topology
from harness.lab.fault import LabStack

TRANSFER_CLIENTS = 4
ACCOUNT = "/openapi/v1/account"
QUOTE = "/openapi/convert/v1/get-quote"
ACCEPT = "/openapi/convert/v1/accept-quote"
# The peer's conversions, in turn (the spec's quote refresh interval: one a second at most).
CONVERSIONS = [("PHP", "USDT", "50"), ("USDT", "PHP", "1")]
WATCHED = ("USDT", "PHP")  # the peer's assets its client keeps the sum of

# The faults whose run puts the stack on the application hosts behind HAProxy (apphosts.py): the
# rolling restart restarts them too. The others keep the stack in this namespace (their figures).
ON_APP_HOSTS = ("rolling",)

Inject = Callable[["LabRun", Fault], Awaitable[None]]


class LabRun:
    """A lab fault run: the chaos run (`chaos`: its load, record, listeners and wind-down, without the
    private run's faults) on the lab's stack (`stack`, a LabStack), plus the peer converting, the
    replay probe and the heals the lab's fault leaves (what faults.py's faults are given)."""

    STACK_DIR = topology.LAB_DIR / "stack"

    def __init__(self, seed: int, out, base: Path, *, on_app_hosts: bool = False) -> None:
        self.stack = LabStack(base, on_app_hosts=on_app_hosts, stack_dir=self.STACK_DIR)
        self.chaos = Chaos(seed, out, self.stack, faults=None)
        self.record = self.chaos.record
        self.answers, self.segments = self.record.answers, self.record.segments  # what a lab fault reads
        self.conversions: dict[str, dict] = {}  # quoteId -> the quote's amounts and the accept's answer
        self.extra_peer: list[tuple[str, Decimal]] = []  # other acknowledged movements of the peer's USDT
        self.heals: list[Callable[[], Awaitable[None]]] = []

    def start(self) -> None:
        self.chaos.start()

    def stop(self) -> None:
        self.chaos.stop()

    def say(self, text: str) -> None:
        self.record.say(text)

    # --- the peer's view of its money ----------------------------------------------------------------

    async def balances(self, role: str) -> dict[str, Decimal]:
        for _ in range(60):
            status, data, _ = await self.chaos.load.signed(role, "GET", ACCOUNT, {})
            if status == 200:
                return {b["asset"]: Decimal(b["free"]) + Decimal(b["locked"]) for b in data["balances"]}
            await asyncio.sleep(1.0)
        raise RuntimeError(f"GET {ACCOUNT} for {role} failed: {status} {data}")

    async def convert_client(self, stopping: asyncio.Event) -> None:
        """The peer converting back and forth, a quote and its accept every 1.2 s; each accept an Answer
        (kind conversion, ident the quoteId) and the quote's amounts kept for the balance check."""
        for n in range(10**9):
            if stopping.is_set():
                return
            started = now()
            source, target, amount = CONVERSIONS[n % len(CONVERSIONS)]
            params = {"sourceCurrency": source, "targetCurrency": target, "sourceAmount": amount}
            status, data, _ = await self.chaos.load.signed("peer", "POST", QUOTE, params)
            quote = data.get("data") if status == 200 and data.get("status") == 0 else None
            if quote:
                ident = quote["quoteId"]
                self.conversions[ident] = {
                    "source": source,
                    "target": target,
                    "out": Decimal(quote["sourceAmount"]),
                    "in": Decimal(quote["targetAmount"]),
                }
                began = now()
                status, data, _ = await self.chaos.load.signed("peer", "POST", ACCEPT, {"quoteId": ident})
                answer = Answer("conversion", ident, "peer", began, now(), status)
                if status == 200 and data.get("status") == 0:
                    answer.ref = str(data["data"]["orderId"])
                elif status is not None:
                    answer.code = data.get("code", data.get("status"))
                self.record.answers.append(answer)
            await asyncio.sleep(max(0.0, 1.2 - (now() - started)))

    async def replay_probe(self) -> tuple[str, Answer]:
        """A transfer master -> peer without a client id, signed with recvWindow 60000 (its timestamp
        stays good through a failover): the signed query, to be sent again later."""
        params = {"account": "USDT", "target_address": self.chaos.load.world["peer"]["email"], "amount": "0.02"}
        params["recvWindow"] = "60000"
        started = now()
        status, data, query = await self.chaos.load.signed("master", "POST", TRANSFER, params)
        answer = Answer("probe", "replay-probe", "master", started, now(), status, code=data.get("code"))
        if status == 200:
            self.extra_peer.append(("USDT", Decimal("0.02")))
        return query, answer

    async def replay(self, query: str) -> Answer:
        started = now()
        status, body = await self.chaos.load.send_again("master", "POST", TRANSFER, query)
        answer = Answer("replay", "replay-probe", "master", started, now(), status)
        with contextlib.suppress(ValueError, AttributeError):
            answer.code = json.loads(body).get("code")
        if status == 200:
            self.extra_peer.append(("USDT", Decimal("0.02")))  # wrongly accepted: counted so the sum still holds
        return answer

    # --- the run ------------------------------------------------------------------------------------

    async def drive_fault(self, name: str, inject: Inject, before: float, after: float) -> None:
        chaos, load, record = self.chaos, self.chaos.load, self.record
        stopping, listeners_stop = asyncio.Event(), asyncio.Event()
        self.peer_before = await self.balances("peer")
        slots = chaos.listen(listeners_stop)
        await chaos.listening()
        record.load_started()
        running = [asyncio.create_task(load.transfer_client(i, stopping)) for i in range(TRANSFER_CLIENTS)]
        running.append(asyncio.create_task(load.money_out(stopping)))
        running.append(asyncio.create_task(self.convert_client(stopping)))
        await asyncio.sleep(before)
        fault = Fault(name)
        record.faults.append(fault)
        record.say(f"fault: {name}")
        await inject(self, fault)
        record.say(f"fault: {name}: {'; '.join(fault.steps)}")
        await asyncio.sleep(after)
        fault.until = now()
        stopping.set()
        await asyncio.gather(*running)
        record.load_stopped()
        for heal in self.heals:  # a fault's host brought back, once the window is measured
            await heal()
        await chaos.wind_down(slots, listeners_stop)
        self.peer_after = await self.balances("peer")


# --- the figures --------------------------------------------------------------------------------------


def window(run: LabRun, fault: Fault) -> list[str]:
    """Writes (transfers) around the fault: the first refused or unanswered, the last, and when the
    first request started after the last one was answered 200 (writes accepted again)."""
    writes = sorted(
        (a for a in run.record.answers if a.kind == "transfer" and a.started >= fault.start), key=lambda a: a.started
    )
    failed = [a for a in writes if a.status != 200]
    slow = max((a.ended - a.started for a in writes if a.status == 200), default=0.0)
    lines = [f"transfers after the fault: {len(writes)} {tally(writes)}; slowest 200: {slow:.1f} s"]
    if not failed:
        fault.window = 0.0
        lines.append("no transfer after the fault was refused or unanswered")
        return lines
    last = max(failed, key=lambda a: a.ended)
    back = next((a for a in writes if a.started >= last.ended and a.status == 200), None)
    fault.window = (back.started - fault.start) if back else None
    first = min(a.ended for a in failed)
    lines.append(
        f"writes refused from +{first - fault.start:.1f} s to +{last.ended - fault.start:.1f} s; "
        + (f"accepted again at +{fault.window:.1f} s after the fault" if back else "NOT accepted again within the run")
    )
    return lines


def check_conversions(run: LabRun) -> Check:
    sent = [a for a in run.record.answers if a.kind == "conversion"]
    rows = run.stack.book.rows(
        "SELECT q.quote_id, o.id, o.status FROM convert_order o JOIN convert_quote q ON q.id = o.quote_id"
        " WHERE o.user_id = %s",
        [run.chaos.load.ids["peer"]],
    )
    in_db: dict[str, list[tuple[str, str]]] = {}
    for quote, pk, status in rows:
        in_db.setdefault(quote, []).append((str(pk), status))
    bad = []
    for a in sent:
        found = in_db.get(a.ident, [])
        if a.status == 200 and a.ref and [pk for pk, st in found if st == "SUCCESS"] != [a.ref]:
            bad.append(f"quote {a.ident} accepted (order {a.ref}) but the database has {found}")
        if len(found) > 1:
            bad.append(f"quote {a.ident}: {len(found)} orders")
        if a.status is not None and 400 <= a.status < 500 and any(st == "SUCCESS" for _, st in found):
            bad.append(f"quote {a.ident} refused {a.label} but converted: {found}")
    unknown = [a for a in sent if a.unknown or (a.status == 200 and not a.ref)]
    done = sum(1 for a in unknown if any(st == "SUCCESS" for _, st in in_db.get(a.ident, [])))
    detail = (
        f"{len(sent)} accepts {tally(sent)}: every accepted one once in the database with its order id; "
        f"{len(unknown)} without a clear answer, {done} of them done"
    )
    if bad:
        detail += "\n      " + "\n      ".join(bad[:10])
    run.converted = {q for q, found in in_db.items() if any(st == "SUCCESS" for _, st in found)}
    return Check("conversions", not bad, detail)


def transfer_amount(ident: str) -> Decimal:
    """chaos.load's unique amount of transfer n (ident chaosSEED-tN)."""
    return Decimal("0.01") + Decimal(int(ident.rsplit("-t", 1)[1])) * Decimal("0.000001")


def check_balances(run: LabRun) -> Check:
    """The peer's balances as GET /openapi/v1/account gives them against what its client computed:
    the balances before the load, plus every transfer answered 200 (or, without an answer, found by
    its client id), plus every conversion accepted (or found done), with the quote's amounts."""
    expected = {asset: run.peer_before.get(asset, Decimal(0)) for asset in WATCHED}
    for a in run.record.answers:
        if a.kind != "transfer":
            continue
        made = a.status == 200 or (a.unknown and run.record.resolved.get(a.ident))
        if made:
            expected["USDT"] += transfer_amount(a.ident) * (1 if a.role == "master" else -1)
    for quote, amounts in run.conversions.items():
        if quote in run.converted:
            expected[amounts["source"]] -= amounts["out"]
            expected[amounts["target"]] += amounts["in"]
    for asset, amount in run.extra_peer:
        expected[asset] += amount
    told = {asset: run.peer_after.get(asset, Decimal(0)) for asset in WATCHED}
    ok = told == expected
    detail = ", ".join(f"{asset} {told[asset]} (client's sum {expected[asset]})" for asset in WATCHED)
    return Check("balances", ok, f"the peer's account endpoint against its client's sums: {detail}")


def check_answers(run: LabRun) -> Check:
    answers = run.record.answers
    broken = [a for a in answers if a.breaks_a_rule]
    fives = [a for a in answers if a.status is not None and a.status >= 500]
    return Check(
        "answers",
        not broken,
        f"{len(answers)} requests; 5xx {tally(fives)}; breaking the rules (a 500, another 5xx, hung): {tally(broken)}",
    )


def check_database_role() -> Check:
    """The run proved the service as the application's own role, not as a superuser."""
    problems = cluster.app_role_problems()
    detail = "; ".join(problems) or f"{topology.APP_USER}: LOGIN and CREATEDB only, owner of {topology.DATABASE}"
    return Check("database role", not problems, detail)


def run_fault(name: str, inject: Inject, *, before: float, after: float, out) -> bool:
    """The stack on the lab, the load, the fault, the bank check; the report to `out`."""
    import tempfile

    if cluster.pg_leader() is None:
        raise SystemExit("the lab is not up: python -m harness.lab up")
    run = LabRun(int(time.time()) % 100000, out, Path(tempfile.gettempdir()), on_app_hosts=name in ON_APP_HOSTS)
    run.start()
    checks: list[Check] = []
    try:
        asyncio.run(run.drive_fault(name, inject, before, after))
        fault = run.record.faults[0]
        lines = [*fault.steps, *window(run, fault), *fault.lines]
        checks = [
            check_ledger(run.chaos),
            check_transfers(run.chaos),
            check_conversions(run),
            check_withdrawals(run.chaos),
            check_collections(run.chaos),
            check_websockets(run.chaos),
            check_balances(run),
            check_answers(run),
        ]
        checks += [Check(p.split(":")[0], False, p) for p in fault.problems]
        checks.append(check_database_role())
    finally:
        run.stop()
    run.say(f"after: {json.dumps(cluster.status())}")
    for line in lines:
        run.say(line)
    for check in checks:
        run.say(f"{'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    ok = all(c.ok for c in checks)
    run.say(("PASS " if ok else "FAIL ") + name)
    return ok


def main(argv: list[str]) -> int:
    """`python -m harness.lab fault [NAME] [--before S] [--after S]` (default pg-kill)."""
    import argparse
    import sys

    from harness.lab.faults import FAULTS

    parser = argparse.ArgumentParser(prog="python -m harness.lab fault")
    parser.add_argument("name", nargs="?", default="pg-kill", choices=sorted(FAULTS))
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the fault")
    parser.add_argument("--after", type=float, default=40.0, help="seconds of load after it")
    args = parser.parse_args(argv)
    return 0 if run_fault(args.name, FAULTS[args.name], before=args.before, after=args.after, out=sys.stdout) else 1
