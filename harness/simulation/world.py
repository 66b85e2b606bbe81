"""What the simulation's parts share: the record of the run (`SimRecord`: every answer, client id,
deposit, fault, websocket connection, outcome and broken rule) and the customers (`Customers`: the
demo world's accounts on the stack, and the signed call through its one port)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter, defaultdict
from decimal import Decimal

from harness import client
from harness.chaos.records import Answer, now, send
from harness.ports import HOST
from harness.private import Stack
from harness.simulation.moves import Move
from harness.simulation.plan import PATHS, Window


class SimRecord:
    """What a simulation saw and found, written by its parts and read by its checks and report; `t0`
    is when the schedule started (`say` prints a line of the run's log with the time since)."""

    def __init__(self, seed: int, minutes: float, customers: int, out) -> None:
        self.seed, self.minutes, self.customers, self.out = seed, minutes, customers, out
        self.answers: list[Answer] = []
        self.moves: dict[str, Move] = {}
        self.by_op: dict[int, Move] = {}
        self.deposits: list[dict] = []
        self.expired_quotes: list[dict] = []
        self.windows: list[Window] = []
        self.violations: list[str] = []
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.faults: list[dict] = []
        self.segments: list = []
        self.api_orders: dict[str, list[dict]] = {}  # quoteId -> the orders the customers' histories show
        self.positions: dict[str, list[dict]] = {}  # account -> its change feed at the end
        self.credited: dict[str, list] = {}  # txId -> (account, deposit record) as the histories show
        self.start_balances: dict = {}
        self.end_balances: dict = {}
        self.t0 = now()
        self.load_end = 0.0

    def say(self, text: str) -> None:
        self.out.write(f"[simulate +{now() - self.t0:6.1f}s] {text}\n")
        self.out.flush()


class Customers:
    """The accounts of the demo world `manage.py demo --customers N` loaded on `stack` (`world`, its
    JSON): c1..cN and their sub-accounts c1.sub..cN.sub, the cycle customer ("cycler", the demo's
    master: funded, outside the schedule) and its witness (the demo's peer, which quotes the same
    directions after each cycle and never accepts); their emails, keys and user ids, the transfer
    fees and the quote interval. `call` sends one signed request through the stack's port, recorded
    in `record`."""

    def __init__(self, stack: Stack, record: SimRecord, world: dict) -> None:
        self.stack, self.record = stack, record
        self.emails: dict[str, str] = {}
        self.signers: dict[str, client.Signer] = {}
        for i, entry in enumerate(world["customers"], start=1):
            for role, name in (("master", f"c{i}"), ("sub", f"c{i}.sub")):
                self.emails[name] = entry[role]["email"]
                self.signers[name] = client.Signer(entry[role]["api_key"], entry[role]["secret_key"])
        for name, role in (("cycler", "master"), ("witness", "peer")):
            self.emails[name] = world[role]["email"]
            self.signers[name] = client.Signer(world[role]["api_key"], world[role]["secret_key"])
        book = stack.book
        ids = dict(book.rows("SELECT email, id FROM accounts_user WHERE email = ANY(%s)", [list(self.emails.values())]))
        self.ids = {name: ids[email] for name, email in self.emails.items()}
        self.fees = {
            code: Decimal(fee)
            for code, fee in book.rows(
                "SELECT a.code, f.fee FROM wallet_transferfee f JOIN accounts_asset a ON a.id = f.asset_id"
            )
        }
        self.quote_interval = int(stack.env.get("CONVERT_QUOTE_INTERVAL_MS", "1000")) / 1000

    async def call(self, who: str, name: str, params: dict, *, kind: str, ident: str = "", query: str | None = None):
        """One signed request through the stack's port (`query`: the signed text of an earlier one, for
        a replay), recorded; (answer, decoded body or {})."""
        method, path = PATHS[name]
        signer = self.signers[who]
        query = query if query is not None else signer.signed(params)
        conn = client.HttpConnection(HOST, self.stack.port)
        started = now()
        try:
            status, body, hung = await send(conn, method, f"{path}?{query}", signer.api_key)
        finally:
            await conn.close()
        answer = Answer(kind, ident, who, started, now(), status, hung=hung, query=query)
        data: dict = {}
        if status is not None:
            with contextlib.suppress(ValueError):
                decoded = json.loads(body)
                data = decoded if isinstance(decoded, (dict, list)) else {}
            if status != 200 and isinstance(data, dict):
                answer.code = data.get("code")
        self.record.answers.append(answer)
        return answer, data

    async def settled_call(self, who: str, name: str, params: dict, *, kind: str = "query", tries: int = 20):
        """A query that must get through eventually (the end's questions): retried while unknown."""
        for _ in range(tries):
            answer, data = await self.call(who, name, params, kind=kind)
            if answer.status == 200:
                return data
            await asyncio.sleep(1.0)
        raise RuntimeError(f"{name} {params} never answered 200 (last {answer.label})")

    async def balances(self, who: str) -> dict[str, tuple[Decimal, Decimal]]:
        """{asset: (free + locked, locked)} as the service reports them."""
        data = await self.settled_call(who, "account", {})
        return {b["asset"]: (Decimal(b["free"]) + Decimal(b["locked"]), Decimal(b["locked"])) for b in data["balances"]}
