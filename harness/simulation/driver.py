"""The simulation's timeline: the world up, the customers' operations at their times, the faults, the
cycle customer, then settling."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from harness.chaos.records import Check, now
from harness.private import PrivateStack, Stack
from harness.simulation.checks import EndChecks
from harness.simulation.cycles import CycleCustomer
from harness.simulation.faults import Faults
from harness.simulation.flows import Flows
from harness.simulation.plan import Op, digest, schedule
from harness.simulation.settle import Settle
from harness.simulation.world import Customers, SimRecord


class Simulation:
    """A seeded simulation on a stack (a Stack: `new_stack` makes a PrivateStack; simulation/lab.py's
    LabSimulation the lab's): the schedule from the seed (`ops`, `fault_plan`), the record of the run
    (`record`), and, once `start` has the stack up with the demo world, its parts, each given what it
    uses: the customers (`accounts`), their operations (`flows`), the faults and websockets
    (`faults`), settling (`settle`), the cycle customer (`cycler`) and the end checks (`checks`)."""

    def __init__(self, seed: int, minutes: float, customers: int, out) -> None:
        self.seed, self.minutes, self.customers = seed, minutes, customers
        self.ops, self.fault_plan = schedule(seed, minutes, customers)
        self.record = SimRecord(seed, minutes, customers, out)

    def new_stack(self, base: Path) -> Stack:
        return PrivateStack(base)

    def new_faults(self) -> Faults:
        return Faults(self.stack, self.accounts, self.record, self.fault_plan)

    def describe(self) -> str:
        return self.stack.describe()

    @property
    def stack_log(self) -> Path:
        """The stack's programs' output (supervisord's log)."""
        return self.stack.run_dir / "stack.log"

    # --- set-up ------------------------------------------------------------------------------------------

    def start(self, base: Path) -> None:
        self.stack = self.new_stack(base)
        world = self.stack.start(
            "sim",
            "--json",
            "--customers",
            str(self.customers),
            SIM_CHAIN_BLOCK_SECONDS="1",
            CHAIN_SCAN_SECONDS="1",
        )
        self.accounts = Customers(self.stack, self.record, world)
        self.flows = Flows(self.stack, self.accounts, self.record)
        self.faults = self.new_faults()
        self.settle = Settle(self.stack, self.accounts, self.record)
        self.cycler = CycleCustomer(self.stack, self.accounts, self.record)
        self.checks = EndChecks(self.accounts, self.record)
        self.record.say(f"{self.describe()}; {self.customers} customers and the cycle customer")

    def stop(self) -> None:
        self.stack.stop()

    def end_checks(self, ledger: Check) -> list[Check]:
        """`manage.py ledger_check`'s verdict (`ledger`) and the simulation's own end checks."""
        return [
            ledger,
            self.checks.check_balances(),
            self.checks.check_streams(),
            self.check_answers(),
            self.cycler.check_convert_pnl(),
            self.cycler.check_cycles(),
        ]

    def check_answers(self) -> Check:
        return self.checks.check_answers()

    # --- the run ---------------------------------------------------------------------------------------------------

    async def drive(self) -> None:
        record, accounts, flows = self.record, self.accounts, self.flows
        masters = [f"c{i}" for i in range(1, self.customers + 1)]
        record.start_balances = {who: await accounts.balances(who) for who in accounts.signers}
        listeners_stop, stopping = asyncio.Event(), asyncio.Event()
        slots = [asyncio.create_task(self.faults.listener(who, listeners_stop)) for who in masters]
        while len({s.account for s in record.segments}) < len(masters):
            await asyncio.sleep(0.1)
        record.t0 = now()
        record.say(
            f"schedule {digest(self.ops, self.fault_plan)}: {len(self.ops)} operations "
            f"{dict(Counter(o.kind for o in self.ops))}, faults {[n for _, n in self.fault_plan]}"
        )
        faults = asyncio.create_task(self.faults.faults_timeline(stopping))
        cycles = asyncio.create_task(self.cycler.cycle_customer(stopping))
        running: set[asyncio.Task] = set()
        handlers = {
            "transfer": flows.op_transfer,
            "deposit": flows.op_deposit,
            "withdrawal": flows.op_withdrawal,
            "convert": flows.op_convert,
            "quote_expiry": flows.op_quote_expiry,
            "universal": flows.op_universal,
            "sub_to_master": flows.op_sub_to_master,
            "collect": flows.op_collect,
            "key_change": flows.op_key_change,
            "duplicate": flows.op_again,
            "replay": flows.op_again,
        }

        async def run(op: Op) -> None:
            try:
                await handlers[op.kind](op)
            except Exception as exc:  # noqa: BLE001 - a driver defect: reported, the run goes on
                record.violations.append(f"the driver failed on operation {op.n} ({op.kind}): {exc!r}")
            finally:
                move = record.by_op.get(op.n)
                if move is not None:
                    move.done.set()

        for op in self.ops:
            await asyncio.sleep(max(0.0, record.t0 + op.at - now()))
            task = asyncio.create_task(run(op))
            running.add(task)
            task.add_done_callback(running.discard)
        record.load_end = now()
        stopping.set()
        await asyncio.gather(*running)
        await faults
        try:
            await cycles
        except Exception as exc:  # noqa: BLE001 - a driver defect: reported, the run goes on
            record.violations.append(f"the driver failed in the cycle customer: {exc!r}")
        record.say(f"load over ({len(self.ops)} operations); settling the work in flight")
        await self.settle.settle_work()
        await self.settle.settle_streams(masters)
        listeners_stop.set()
        await asyncio.gather(*slots)
        await self.settle.resolve()
        record.end_balances = {who: await accounts.balances(who) for who in accounts.signers}
