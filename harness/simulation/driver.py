"""The simulation's timeline: the world up, the customers' operations at their times, the faults, the
cycle customer, then settling."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

from harness import client
from harness.chaos.records import now
from harness.private import OnAStack
from harness.simulation.checks import EndChecks
from harness.simulation.cycles import Cycle, CycleCustomer
from harness.simulation.faults import Faults
from harness.simulation.flows import Flows
from harness.simulation.moves import Move
from harness.simulation.plan import Op, Window, digest, schedule
from harness.simulation.settle import Settle


class Simulation(Flows, Faults, Settle, EndChecks, CycleCustomer, OnAStack):
    def __init__(self, seed: int, minutes: float, customers: int, out) -> None:
        self.seed, self.minutes, self.customers, self.out = seed, minutes, customers, out
        self.ops, self.fault_plan = schedule(seed, minutes, customers)
        self.answers: list = []
        self.moves: dict[str, Move] = {}
        self.by_op: dict[int, Move] = {}
        self.deposits: list[dict] = []
        self.expired_quotes: list[dict] = []
        self.windows: list[Window] = []
        self.violations: list[str] = []
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.faults: list[dict] = []
        self.segments: list = []
        self.addresses: dict[tuple, tuple[str, str]] = {}
        self.key_locks: dict[int, asyncio.Lock] = {}
        self.cycles: list[Cycle] = []
        self.quoted: dict[tuple, float] = {}  # (account, direction) -> when its last quote was answered
        self.api_orders: dict[str, list[dict]] = {}
        self.pair_places: dict[tuple, int] = {}  # (source, target) -> the target amount's decimals
        self.t0 = now()

    def say(self, text: str) -> None:
        self.out.write(f"[simulate +{now() - self.t0:6.1f}s] {text}\n")
        self.out.flush()

    # --- set-up ------------------------------------------------------------------------------------------

    def start(self, base: Path) -> None:
        world = self.start_stack(
            base,
            "sim",
            "--json",
            "--customers",
            str(self.customers),
            SIM_CHAIN_BLOCK_SECONDS="1",
            CHAIN_SCAN_SECONDS="1",
        )
        self.emails: dict[str, str] = {}
        self.signers: dict[str, client.Signer] = {}
        for i, entry in enumerate(world["customers"], start=1):
            for role, name in (("master", f"c{i}"), ("sub", f"c{i}.sub")):
                self.emails[name] = entry[role]["email"]
                self.signers[name] = client.Signer(entry[role]["api_key"], entry[role]["secret_key"])
        # The cycle customer is the demo's master (funded, outside the schedule); the demo's peer
        # quotes the same directions after each cycle (the witness) and never accepts.
        for name, role in (("cycler", "master"), ("witness", "peer")):
            self.emails[name] = world[role]["email"]
            self.signers[name] = client.Signer(world[role]["api_key"], world[role]["secret_key"])
        ids = dict(
            self.book.rows("SELECT email, id FROM accounts_user WHERE email = ANY(%s)", [list(self.emails.values())])
        )
        self.ids = {name: ids[email] for name, email in self.emails.items()}
        self.fees = {
            code: Decimal(fee)
            for code, fee in self.book.rows(
                "SELECT a.code, f.fee FROM wallet_transferfee f JOIN accounts_asset a ON a.id = f.asset_id"
            )
        }
        self.quote_interval = int(self.env.get("CONVERT_QUOTE_INTERVAL_MS", "1000")) / 1000
        self.say(f"{self.describe()}; {self.customers} customers and the cycle customer")

    # --- the run ---------------------------------------------------------------------------------------------------

    async def drive(self) -> None:
        masters = [f"c{i}" for i in range(1, self.customers + 1)]
        self.start_balances = {who: await self.balances(who) for who in self.signers}
        listeners_stop, stopping = asyncio.Event(), asyncio.Event()
        slots = [asyncio.create_task(self.listener(who, listeners_stop)) for who in masters]
        while len({s.account for s in self.segments}) < len(masters):
            await asyncio.sleep(0.1)
        self.t0 = now()
        self.say(
            f"schedule {digest(self.ops, self.fault_plan)}: {len(self.ops)} operations "
            f"{dict(Counter(o.kind for o in self.ops))}, faults {[n for _, n in self.fault_plan]}"
        )
        faults = asyncio.create_task(self.faults_timeline(stopping))
        cycles = asyncio.create_task(self.cycle_customer(stopping))
        running: set[asyncio.Task] = set()
        handlers = {
            "transfer": self.op_transfer,
            "deposit": self.op_deposit,
            "withdrawal": self.op_withdrawal,
            "convert": self.op_convert,
            "quote_expiry": self.op_quote_expiry,
            "universal": self.op_universal,
            "sub_to_master": self.op_sub_to_master,
            "collect": self.op_collect,
            "key_change": self.op_key_change,
            "duplicate": self.op_again,
            "replay": self.op_again,
        }

        async def run(op: Op) -> None:
            try:
                await handlers[op.kind](op)
            except Exception as exc:  # noqa: BLE001 - a driver defect: reported, the run goes on
                self.violations.append(f"the driver failed on operation {op.n} ({op.kind}): {exc!r}")
            finally:
                move = self.by_op.get(op.n)
                if move is not None:
                    move.done.set()

        for op in self.ops:
            await asyncio.sleep(max(0.0, self.t0 + op.at - now()))
            task = asyncio.create_task(run(op))
            running.add(task)
            task.add_done_callback(running.discard)
        self.load_end = now()
        stopping.set()
        await asyncio.gather(*running)
        await faults
        try:
            await cycles
        except Exception as exc:  # noqa: BLE001 - a driver defect: reported, the run goes on
            self.violations.append(f"the driver failed in the cycle customer: {exc!r}")
        self.say(f"load over ({len(self.ops)} operations); settling the work in flight")
        await self.settle_work()
        await self.settle_streams(masters)
        listeners_stop.set()
        await asyncio.gather(*slots)
        await self.resolve()
        self.end_balances = {who: await self.balances(who) for who in self.signers}
