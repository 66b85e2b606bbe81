#!/usr/bin/env python3
"""A seeded simulation of the whole exchange in the spirit of TigerBeetle's VOPR and Jepsen's bank
test (issue 18, item 6): `manage.py simulate --seed N --minutes M` (or this file directly).

1. The world: scripts/chaos.py's private PostgreSQL cluster and private Redis (AOF), migrated, with
   `manage.py demo --customers K`: K customers, each a master with one sub-account, keys for both,
   funding and a withdrawal whitelist. The stack exactly as `make run` starts it (exchange/stack.py:
   nginx, granian, Daphne, Celery worker and beat), through nginx's one port; the simulated chain's
   blocks every second.
2. The schedule: from the seed alone (`schedule()`; the same seed gives the same schedule, its digest
   is printed): operations at Poisson-distributed times, each with its customer, counterparty, asset
   and amount - deposits (the customer asks for its deposit address, and the simulated chain's
   outside world sends coins there), withdrawals (the worker broadcasts and settles them), transfers
   between customers, conversions (quote, accept), universal transfers master <-> sub-account,
   sub-to-master transfers signed by the sub-account, fund collections, key changes (the master
   restricts its sub-account's key to a foreign IP and lifts it again; meanwhile the sub-account's
   requests must be refused), a quote accepted after its expiry, a client id sent again, and a
   signed request replayed byte for byte - and infrastructure faults at random times: the Celery
   worker SIGKILLed (whole, or its pool children), Redis restarted, PostgreSQL restarted, and every
   database connection in a transaction terminated (pg_terminate_backend: dropped mid-transaction).
3. Every customer keeps a websocket on its listenKey for the whole run (again after the server
   closes one). The cycle customer (the demo's master) converts round cycles of currencies
   (issue 25, finding 1): the seed's plan over the supported pairs, each leg's source amount what
   the previous leg delivered; a witness (the demo's peer) quotes every direction of a completed
   cycle right after its last leg.
4. The end checks, load stopped and the work in flight settled:
   - `manage.py ledger_check` passes;
   - every account's balance (free + locked, from the API) equals its starting balance plus the sum of
     what the simulator saw acknowledged: deposits the service reports credited, transfers, conversions,
     sub-account transfers and collections answered 200, withdrawals by their final state. An unknown
     outcome (no answer, a 5xx) is resolved as the client would: by asking the service with the
     client id. Nothing locked is left over;
   - no answer broke a rule: never a 5xx but 503 -1001, never a request hung; a client id sent again,
     a replayed signature, an expired quote and a restricted key were all refused;
   - every websocket that stayed connected received every committed change of its account exactly
     once and in order, the last with the database's balance (one the server closed: a gapless run);
   - the house's convert P&L: no successful order lost at its own quote's market price;
   - no completed cycle ended richer than the market moved while it went round (check_cycles).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: scripts/ is on the path, the project root is not
    sys.path.insert(0, str(ROOT))

from scripts import chaos  # noqa: E402 - the private services, the stack, the recorded answers, the judge
from scripts.convert_cycles import (  # noqa: E402
    Cycle,
    CycleCustomer,
)
from scripts.simulation_moves import Move, _amount  # noqa: E402

_load = chaos._load
psycopg = chaos.psycopg
HOST = chaos.HOST
now = chaos.now

OPS_PER_SECOND = 5.0
WEIGHTS = {
    "transfer": 26,
    "deposit": 10,
    "withdrawal": 8,
    "convert": 12,
    "universal": 10,
    "sub_to_master": 6,
    "collect": 4,
    "key_change": 2,
    "duplicate": 6,
    "replay": 6,
    "quote_expiry": 2,
}
INFRA_FAULTS = ("worker_kill", "worker_children_kill", "redis_restart", "postgres_restart", "connections_dropped")
FIRST_FAULT_SECONDS = 8.0
FAULT_GAP_SECONDS = (12.0, 30.0)
QUIET_END_SECONDS = 8.0  # no fault starts this close to the end of the load
SETTLE_SECONDS = 180.0
FOREIGN_IP = "198.51.100.7"  # TEST-NET-2: never this driver
REPEATABLE = ("transfer", "universal", "sub_to_master", "withdrawal", "collect")
# (coin, network, amount range, decimal places): deposits stay below the travel rule's threshold
DEPOSITS = [("USDT", "TRX", (5, 200), 2), ("ETH", "ETH", (0.01, 0.2), 4), ("USDT", "ETH", (5, 100), 2)]
WITHDRAWALS = [("ETH", "ETH", (0.01, 0.05), 4), ("USDT", "TRX", (10, 60), 2)]
TRANSFERS = [("USDT", (0.5, 40), 2), ("PHP", (10, 2000), 2), ("BTC", (0.0001, 0.002), 6), ("ETH", (0.001, 0.05), 5)]
CONVERTS = [
    ("USDT", "PHP", (2, 60), 2),
    ("PHP", "USDT", (100, 3000), 2),
    ("ETH", "USDT", (0.002, 0.05), 4),
    ("USDT", "ETH", (5, 80), 2),
    ("BTC", "USDT", (0.0002, 0.003), 5),
    ("USDT", "BTC", (5, 150), 2),
]
SUB_MOVES = [("USDT", (1, 50), 2), ("PHP", (10, 1500), 2), ("BTC", (0.0001, 0.002), 6)]
WHITELIST = {"ETH": "0x00000000000000000000000000000000000d3e40", "TRX": "TDemoMasterWhitezistAddress1111111"}
PATHS = {
    "transfer": ("POST", "/openapi/transfer/v4/transfers"),
    "transfer_query": ("GET", "/openapi/transfer/v3/transfers"),
    "deposit_address": ("GET", "/openapi/wallet/v1/deposit/address"),
    "sub_deposit_address": ("GET", "/openapi/v1/sub-account/wallet/deposit/address"),
    "deposit_history": ("GET", "/openapi/wallet/v1/deposit/history"),
    "sub_deposit_history": ("GET", "/openapi/v1/sub-account/wallet/deposit/history"),
    "withdrawal": ("POST", "/openapi/wallet/v1/withdraw/apply"),
    "withdraw_history": ("GET", "/openapi/wallet/v1/withdraw/history"),
    "quote": ("POST", "/openapi/convert/v1/get-quote"),
    "accept": ("POST", "/openapi/convert/v1/accept-quote"),
    "orders": ("POST", "/openapi/convert/v1/query-order-history"),
    "universal": ("POST", "/openapi/v1/sub-account/transfer/universal-transfer"),
    "universal_history": ("GET", "/openapi/v1/sub-account/transfer/universal-transfer-history"),
    "sub_to_master": ("POST", "/openapi/v1/sub-account/transfer/sub-to-master"),
    "sub_history": ("GET", "/openapi/v1/sub-account/transfer/sub-history"),
    "collect": ("POST", "/openapi/v1/fund-collect/collect-from-sub-account"),
    "fund_record": ("GET", "/openapi/v1/fund-collect/get-fund-record"),
    "restrict": ("POST", "/openapi/v1/sub-account/apikey/add-ip-restriction"),
    "unrestrict": ("POST", "/openapi/v1/sub-account/apikey/delete-ip-restriction"),
    "account": ("GET", "/openapi/v1/account"),
    "listen_key": ("POST", "/openapi/v1/userDataStream"),
    "pairs": ("POST", "/openapi/convert/v1/get-supported-trading-pairs"),
}


# --- the schedule: a function of the seed alone ----------------------------------------------------------


@dataclass
class Op:
    n: int
    at: float  # seconds after the load starts
    kind: str
    customer: int  # 1..K
    params: dict = field(default_factory=dict)


def schedule(seed: int, minutes: float, customers: int) -> tuple[list[Op], list[tuple[float, str]]]:
    """Every operation and fault of a run, from the seed alone."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    duration = minutes * 60.0
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    ops: list[Op] = []
    t = 1.0
    while True:
        t += rng.expovariate(OPS_PER_SECOND)
        if t >= duration:
            break
        kind = rng.choices(kinds, weights)[0]
        customer = rng.randint(1, customers)
        op = Op(len(ops), round(t, 3), kind, customer)
        p = op.params
        if kind == "transfer":
            asset, bounds, places = rng.choice(TRANSFERS)
            p.update(
                asset=asset,
                amount=_amount(rng, bounds, places),
                to=rng.choice([c for c in range(1, customers + 1) if c != customer] or [customer]),
            )
        elif kind == "deposit":
            coin, network, bounds, places = rng.choice(DEPOSITS)
            p.update(coin=coin, network=network, amount=_amount(rng, bounds, places), sub=rng.random() < 0.3)
        elif kind == "withdrawal":
            coin, network, bounds, places = rng.choice(WITHDRAWALS)
            p.update(coin=coin, network=network, amount=_amount(rng, bounds, places))
        elif kind in ("convert", "quote_expiry"):
            source, target, bounds, places = rng.choice(CONVERTS)
            p.update(source=source, target=target, amount=_amount(rng, bounds, places))
        elif kind in ("universal", "sub_to_master"):
            asset, bounds, places = rng.choice(SUB_MOVES)
            p.update(
                asset=asset, amount=_amount(rng, bounds, places), to_sub=kind == "universal" and rng.random() < 0.6
            )
        elif kind == "key_change":
            p.update(hold=round(rng.uniform(3.0, 8.0), 2))
        elif kind in ("duplicate", "replay"):
            # an earlier client-id operation, 3-40 s before (a replay within the 60 s recvWindow)
            earlier = [o for o in ops if o.kind in REPEATABLE and 3.0 <= t - o.at <= 40.0]
            if not earlier:
                continue
            p.update(of=rng.choice(earlier).n)
        ops.append(op)
    faults: list[tuple[float, str]] = []
    order = list(INFRA_FAULTS)
    rng.shuffle(order)
    # Short runs still meet every kind of fault once: the gaps shrink to fit them (not under 8 s).
    per = (duration - FIRST_FAULT_SECONDS - QUIET_END_SECONDS) / len(INFRA_FAULTS)
    gaps = FAULT_GAP_SECONDS if per >= FAULT_GAP_SECONDS[1] else (max(8.0, 0.8 * per), max(8.0, per))
    t = FIRST_FAULT_SECONDS
    while t < duration - QUIET_END_SECONDS:
        name = order[len(faults)] if len(faults) < len(order) else rng.choice(INFRA_FAULTS)
        faults.append((round(t, 3), name))
        t += rng.uniform(*gaps)
    return ops, faults


def digest(ops: list[Op], faults: list[tuple[float, str]]) -> str:
    text = json.dumps([[o.n, o.at, o.kind, o.customer, o.params] for o in ops] + [faults], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- what happened to each client id ------------------------------------------------------------------------


@dataclass
class Window:
    """A sub-account key restricted to a foreign IP: its own requests must be refused between
    `start` (the restriction's answer + 1 s) and `end` (when lifting it was sent)."""

    account: str
    start: float
    end: float = float("inf")


class Simulation(CycleCustomer, chaos.PrivateStack):
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
        self.signers: dict[str, _load.Signer] = {}
        for i, entry in enumerate(world["customers"], start=1):
            for role, name in (("master", f"c{i}"), ("sub", f"c{i}.sub")):
                self.emails[name] = entry[role]["email"]
                self.signers[name] = _load.Signer(entry[role]["api_key"], entry[role]["secret_key"])
        # The cycle customer is the demo's master (funded, outside the schedule); the demo's peer
        # quotes the same directions after each cycle (the witness) and never accepts.
        for name, role in (("cycler", "master"), ("witness", "peer")):
            self.emails[name] = world[role]["email"]
            self.signers[name] = _load.Signer(world[role]["api_key"], world[role]["secret_key"])
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

    # --- requests ----------------------------------------------------------------------------------------

    async def call(self, who: str, name: str, params: dict, *, kind: str, ident: str = "", query: str | None = None):
        """One signed request through nginx (`query`: the signed text of an earlier one, for a replay),
        recorded; (answer, decoded body or {})."""
        method, path = PATHS[name]
        signer = self.signers[who]
        query = query if query is not None else signer.signed(params)
        conn = _load.HttpConnection(HOST, self.port)
        started = now()
        try:
            status, body, hung = await chaos.send(conn, method, f"{path}?{query}", signer.api_key)
        finally:
            await conn.close()
        answer = chaos.Answer(kind, ident, who, started, now(), status, hung=hung, query=query)
        data: dict = {}
        if status is not None:
            with contextlib.suppress(ValueError):
                decoded = json.loads(body)
                data = decoded if isinstance(decoded, (dict, list)) else {}
            if status != 200 and isinstance(data, dict):
                answer.code = data.get("code")
        self.answers.append(answer)
        return answer, data

    async def settled_call(self, who: str, name: str, params: dict, *, kind: str = "query", tries: int = 20):
        """A query that must get through eventually (the end's questions): retried while unknown."""
        for _ in range(tries):
            answer, data = await self.call(who, name, params, kind=kind)
            if answer.status == 200:
                return data
            await asyncio.sleep(1.0)
        raise RuntimeError(f"{name} {params} never answered 200 (last {answer.label})")

    def _move(self, op: Op, kind: str, ident: str, legs, signer: str) -> Move:
        move = self.moves[ident] = Move(kind, ident, legs, signer=signer)
        self.by_op[op.n] = move
        return move

    async def _first(self, op: Op, kind: str, ident: str, legs, signer: str, params: dict):
        """An operation with a client id, sent the first time (`kind` names its endpoint in PATHS):
        its Move, the answer and the body. A 200 with `result: false` is a refusal."""
        move = self._move(op, kind, ident, legs, signer)
        answer, data = await self.call(signer, kind, params, kind=kind, ident=ident)
        move.query, move.params = answer.query, params
        move.answered(answer)
        if answer.status == 200 and isinstance(data, dict) and data.get("result") is False:
            move.state = "refused"  # the transfer failed (e.g. the balance was short)
            answer.code = "result false"
        self._check_restriction(signer, answer)
        self._outcome(kind, answer)
        return move, answer, data

    def _outcome(self, kind: str, answer) -> None:
        label = f"200 {answer.code}" if answer.status == 200 and answer.code else answer.label
        self.outcomes[kind][label] += 1

    def _restricted(self, who: str, answer) -> bool:
        """A sub-account's request that must have been refused by its key's IP restriction."""
        return any(w.account == who and w.start <= answer.started and answer.ended <= w.end for w in self.windows)

    def _check_restriction(self, who: str, answer) -> None:
        if answer.status == 200 and self._restricted(who, answer):
            self.violations.append(
                f"{who}'s key was restricted to {FOREIGN_IP}, yet {answer.kind} {answer.ident} got 200"
            )

    # --- operations ----------------------------------------------------------------------------------------

    async def op_transfer(self, op: Op) -> None:
        p, who, to = op.params, f"c{op.customer}", f"c{op.params['to']}"
        ident = f"s{self.seed}-t{op.n}"
        amount = Decimal(p["amount"])
        legs = [(who, p["asset"], -amount - self.fees.get(p["asset"], Decimal(0))), (to, p["asset"], amount)]
        params = {
            "account": p["asset"],
            "target_address": self.emails[to],
            "amount": p["amount"],
            "client_transfer_id": ident,
        }
        move, answer, data = await self._first(op, "transfer", ident, legs, who, params)
        if answer.status == 200 and data.get("transfer", {}).get("status") != "success":
            move.state = "unknown"  # pending or failed: asked again at the end

    async def _address(self, who: str, coin: str, network: str) -> tuple[str, str] | None:
        key = (who, coin, network)
        if key not in self.addresses:
            if who.endswith(".sub"):
                master = who.split(".")[0]
                params = {"email": self.emails[who], "coin": coin, "network": network}
                answer, data = await self.call(master, "sub_deposit_address", params, kind="deposit_address")
            else:
                answer, data = await self.call(
                    who, "deposit_address", {"coin": coin, "network": network}, kind="deposit_address"
                )
            if answer.status != 200:
                return None
            self.addresses[key] = (data["address"], data.get("addressTag") or "")
        return self.addresses[key]

    async def op_deposit(self, op: Op) -> None:
        p = op.params
        who = f"c{op.customer}.sub" if p["sub"] else f"c{op.customer}"
        address = await self._address(who, p["coin"], p["network"])
        if address is None:
            self.outcomes["deposit"]["no address (refused or no answer)"] += 1
            return
        tx_id = f"sim{self.seed}d{op.n:06d}" + "0" * 40
        deadline = now() + 90
        while True:  # the outside world's chain: independent of our outages in reality, so it insists
            try:
                await asyncio.to_thread(
                    self.book.rows,
                    "INSERT INTO wallet_simtransaction (network, tx_id, output_index, address, tag, amount,"
                    " block_height, incoming, fails) VALUES (%s, %s, 0, %s, %s, %s,"
                    " coalesce((SELECT height FROM wallet_simblockheight WHERE network = %s), 1), true, false)"
                    " RETURNING id",
                    [p["network"], tx_id, address[0], address[1], Decimal(p["amount"]), p["network"]],
                )
                break
            except psycopg.Error:
                if now() > deadline:
                    self.outcomes["deposit"]["chain unreachable"] += 1
                    return
                await asyncio.sleep(0.5)
        self.deposits.append(
            {"who": who, "coin": p["coin"], "network": p["network"], "tx": tx_id, "amount": Decimal(p["amount"])}
        )
        self.outcomes["deposit"]["sent on the chain"] += 1

    async def op_withdrawal(self, op: Op) -> None:
        p, who = op.params, f"c{op.customer}"
        ident = f"s{self.seed}w{op.n}"
        params = {
            "coin": p["coin"],
            "network": p["network"],
            "address": WHITELIST[p["network"]],
            "amount": p["amount"],
            "withdrawOrderId": ident,
        }
        await self._first(op, "withdrawal", ident, [], who, params)  # legs from its final record

    async def _quote(self, who: str, p: dict):
        params = {"sourceCurrency": p["source"], "targetCurrency": p["target"], "sourceAmount": p["amount"]}
        answer, data = await self.call(who, "quote", params, kind="quote")
        if answer.status == 200 and data.get("status") == 0:
            return data["data"]
        self.outcomes["quote refused"][
            f"{answer.label} {data.get('status', '') if isinstance(data, dict) else ''}".strip()
        ] += 1
        return None

    async def op_convert(self, op: Op) -> None:
        p, who = op.params, f"c{op.customer}"
        quote = await self._quote(who, p)
        if quote is None:
            return
        ident = quote["quoteId"]
        legs = [(who, p["source"], -Decimal(quote["sourceAmount"])), (who, p["target"], Decimal(quote["targetAmount"]))]
        move = self._move(op, "convert", ident, legs, who)
        answer, data = await self.call(who, "accept", {"quoteId": ident}, kind="convert", ident=ident)
        if answer.status == 200 and data.get("status") != 0:
            answer.code = data.get("status")
            move.state = "refused"
            self.outcomes["convert"][f"200 envelope {data.get('status')}"] += 1
            return
        move.answered(answer)
        self._outcome("convert", answer)

    async def op_quote_expiry(self, op: Op) -> None:
        p, who = op.params, f"c{op.customer}"
        quote = await self._quote(who, p)
        if quote is None:
            return
        await asyncio.sleep(int(quote["expiry"]) + 1.5)
        answer, data = await self.call(
            who, "accept", {"quoteId": quote["quoteId"]}, kind="quote_expiry", ident=quote["quoteId"]
        )
        refused = answer.status == 200 and data.get("status") == 10000003
        self.expired_quotes.append({"who": who, "quoteId": quote["quoteId"], "answer": answer, "refused": refused})
        self.outcomes["quote_expiry"]["refused 10000003" if refused else answer.label] += 1
        if answer.status == 200 and data.get("status") == 0:
            self.violations.append(
                f"{who} accepted quote {quote['quoteId']} {int(quote['expiry']) + 1.5:.1f} s after its expiry"
            )

    async def op_universal(self, op: Op) -> None:
        p, master = op.params, f"c{op.customer}"
        sub = f"{master}.sub"
        ident = f"s{self.seed}-u{op.n}"
        amount = Decimal(p["amount"])
        source, target = (master, sub) if p["to_sub"] else (sub, master)
        params = {"asset": p["asset"], "amount": p["amount"], "clientTranId": ident}
        params["toEmail" if p["to_sub"] else "fromEmail"] = self.emails[sub]
        legs = [(source, p["asset"], -amount), (target, p["asset"], amount)]
        await self._first(op, "universal", ident, legs, master, params)

    async def op_sub_to_master(self, op: Op) -> None:
        p, master = op.params, f"c{op.customer}"
        sub = f"{master}.sub"
        ident = f"s{self.seed}-m{op.n}"
        amount = Decimal(p["amount"])
        params = {"asset": p["asset"], "amount": p["amount"], "clientTranId": ident}
        legs = [(sub, p["asset"], -amount), (master, p["asset"], amount)]
        await self._first(op, "sub_to_master", ident, legs, sub, params)

    async def op_collect(self, op: Op) -> None:
        master = f"c{op.customer}"
        ident = f"s{self.seed}-c{op.n}"
        # legs from its postings at the end
        await self._first(op, "collect", ident, [], master, {"clientRequestId": ident})

    async def op_key_change(self, op: Op) -> None:
        """The master restricts its sub-account's key to a foreign IP; the sub-account's requests are
        refused from a second after the answer until the restriction is lifted."""
        master = f"c{op.customer}"
        sub = f"{master}.sub"
        lock = self.key_locks.setdefault(op.customer, asyncio.Lock())
        async with lock:
            base = {"apikey": self.signers[sub].api_key, "email": self.emails[sub]}
            answer, _ = await self.call(
                master, "restrict", {**base, "ipAddress": FOREIGN_IP, "ipRestriction": "1"}, kind="key_change"
            )
            self._outcome("key_change restrict", answer)
            window = None
            if answer.status == 200:
                window = Window(sub, answer.ended + 1.0)
                self.windows.append(window)
                await asyncio.sleep(1.2)
                probe, _ = await self.call(sub, "account", {}, kind="restricted_probe")
                self.outcomes["key_change probe (sub's own request)"][probe.label] += 1
                if probe.status == 200:
                    self.violations.append(f"{sub}'s key restricted to {FOREIGN_IP} 1.2 s ago, yet its request got 200")
                await asyncio.sleep(max(0.0, op.params["hold"] - 1.2))
            # Lifted whatever the answer was (an unknown answer may have restricted it): until it is.
            for _ in range(60):
                if window is not None and window.end == float("inf"):
                    window.end = now()
                lifted, _ = await self.call(master, "restrict", {**base, "ipRestriction": "2"}, kind="key_change")
                cleared, _ = await self.call(master, "unrestrict", {**base, "ipAddress": FOREIGN_IP}, kind="key_change")
                if lifted.status == 200 and cleared.status is not None and cleared.status < 500:
                    self._outcome("key_change lift", lifted)
                    return
                await asyncio.sleep(1.0)
            self.violations.append(f"{sub}'s key restriction could not be lifted")

    async def op_again(self, op: Op) -> None:
        """A client id sent again (a fresh signature), or a signed request replayed byte for byte."""
        original = self.by_op.get(op.params["of"])
        if original is None:
            self.outcomes[op.kind]["original never sent"] += 1
            return
        await original.done.wait()
        if not original.query:
            self.outcomes[op.kind]["original never sent"] += 1
            return
        query = original.query if op.kind == "replay" else None
        before = original.state
        answer, data = await self.call(
            original.signer, original.kind, original.params, kind=op.kind, ident=original.ident, query=query
        )
        executed = answer.status == 200 and not (isinstance(data, dict) and data.get("result") is False)
        label = f"{answer.label} (original {before})"
        self.outcomes[f"{op.kind} of {original.kind}"][label] += 1
        if executed and before == "acked":
            what = "replayed signature" if op.kind == "replay" else "client id sent again"
            self.violations.append(f"{what} {original.ident} executed again: {answer.label}")
        elif executed:
            original.state = "acked"  # the first attempt did not run; this one did (counted once)
        elif answer.unknown and before != "acked":
            original.state = "unknown"
        self._check_restriction(original.signer, answer)

    # --- faults ----------------------------------------------------------------------------------------------

    async def fault(self, name: str) -> dict:
        fault = {"name": name, "start": now(), "steps": []}
        away = random.Random(self.seed + len(self.faults)).uniform(2.0, 5.0)  # noqa: S311 - restarts: seconds away
        if name == "redis_restart":
            await asyncio.to_thread(self.redis.stop)
            await asyncio.sleep(away)
            await asyncio.to_thread(self.redis.start)
            fault["steps"].append("Redis SHUTDOWN, started again on its AOF")
        elif name == "postgres_restart":
            await asyncio.to_thread(self.pg.stop, "fast")
            await asyncio.sleep(away)
            await asyncio.to_thread(self.pg.start)
            fault["steps"].append("pg_ctl stop -m fast, started again")
        elif name == "connections_dropped":
            killed = 0
            for _ in range(60):  # for 3 s: whatever is inside a transaction then
                rows = await asyncio.to_thread(
                    self.book.rows,
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'sim'"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    " AND (state LIKE 'idle in transaction%%' OR (state = 'active' AND xact_start IS NOT NULL))",
                )
                killed += rows[0][0]
                await asyncio.sleep(0.05)
            fault["steps"].append(f"pg_terminate_backend: {killed} connections in a transaction dropped")
        elif name == "worker_kill":
            old = self.supervisor.pid("worker")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old, signal.SIGKILL)
            while self.supervisor.procs["worker"].pid == old and now() - fault["start"] < 60:
                await asyncio.sleep(0.2)
            fault["steps"].append(
                f"SIGKILL to the whole worker ({old}); started again as {self.supervisor.procs['worker'].pid}"
            )
        elif name == "worker_children_kill":
            children = chaos.process_children(self.supervisor.pid("worker"))
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            fault["steps"].append(f"SIGKILL to the worker's pool children {children}")
        fault["end"] = now()
        return fault

    async def faults_timeline(self, stopping: asyncio.Event) -> None:
        for at, name in self.fault_plan:
            await asyncio.sleep(max(0.0, self.t0 + at - now()))
            if stopping.is_set():
                return
            self.say(f"fault {len(self.faults) + 1}: {name}")
            fault = await self.fault(name)
            self.faults.append(fault)
            self.say(
                f"fault {len(self.faults)}: {name} over in {fault['end'] - fault['start']:.1f} s "
                f"({'; '.join(fault['steps'])})"
            )

    # --- websockets ----------------------------------------------------------------------------------------------

    async def seq_of(self, who: str) -> int:
        while True:
            try:
                rows = await asyncio.to_thread(
                    self.book.rows, "SELECT seq FROM accounts_ledgeraccount WHERE user_id = %s", [self.ids[who]]
                )
                return rows[0][0]
            except psycopg.Error:
                await asyncio.sleep(0.5)

    async def listener(self, who: str, stop: asyncio.Event) -> None:
        """One websocket on the customer's listenKey for the whole run; again whenever the server closes it."""
        while not stop.is_set():
            lo = await self.seq_of(who)
            answer, data = await self.call(who, "listen_key", {}, kind="listenkey")
            if answer.status != 200:
                await asyncio.sleep(0.5)
                continue
            feed = chaos.PositionFeed(f"ws://{HOST}:{self.port}/openapi/ws/{data['listenKey']}")
            try:
                await feed.start()
            except Exception:  # noqa: BLE001 - refused at the handshake or unreachable: again
                await asyncio.sleep(0.5)
                continue
            segment = chaos.Segment(int(who[1:]), lo, await self.seq_of(who), now(), feed, account=who)
            self.segments.append(segment)
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({feed._task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if feed._task.done() and not stop.is_set():
                segment.closed = now()
                segment.closed_with = str(feed.closed_with) if feed.closed_with is not None else (feed.error or "?")
                await asyncio.sleep(0.2)
                continue
            await feed.stop()

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

    async def balances(self, who: str) -> dict[str, tuple[Decimal, Decimal]]:
        """{asset: (free + locked, locked)} as the service reports them."""
        data = await self.settled_call(who, "account", {})
        return {b["asset"]: (Decimal(b["free"]) + Decimal(b["locked"]), Decimal(b["locked"])) for b in data["balances"]}

    async def settle_work(self) -> None:
        """Until every withdrawal and collection is final and every deposit sent is credited."""
        deadline = now() + SETTLE_SECONDS
        txs = [d["tx"] for d in self.deposits]
        while now() < deadline:
            with contextlib.suppress(psycopg.Error):
                open_ = await asyncio.to_thread(
                    self.book.one,
                    "SELECT (SELECT count(*) FROM wallet_withdrawal WHERE withdraw_order_id LIKE %s"
                    "        AND NOT stage = ANY(%s)),"
                    " (SELECT count(*) FROM subaccounts_fundcollection WHERE client_request_id LIKE %s"
                    "        AND NOT status = ANY(%s)),"
                    " %s - (SELECT count(*) FROM wallet_deposit WHERE tx_id = ANY(%s) AND status = 1),"
                    " (SELECT count(*) FROM convert_order WHERE status = ANY(%s))",
                    [
                        f"s{self.seed}w%",
                        list(chaos.FINAL_WITHDRAWAL),
                        f"s{self.seed}-c%",
                        list(chaos.FINAL_COLLECTION),
                        len(txs),
                        txs,
                        ["TODO", "PROCESSING"],
                    ],
                )
                if not any(open_):
                    self.say(f"all work final {now() - self.load_end:.1f} s after the load")
                    return
            await asyncio.sleep(1.0)
        self.violations.append(
            f"work still open {SETTLE_SECONDS:.0f} s after the load "
            f"(withdrawals, collections, deposits, orders): {open_}"
        )

    async def settle_streams(self, masters: list[str]) -> None:
        await asyncio.sleep(1.5)
        self.positions = {
            who: await asyncio.to_thread(chaos.account_positions, self.book, self.ids[who]) for who in masters
        }

        def caught_up(segment) -> bool:
            positions = self.positions[segment.account]
            if not positions:
                return True
            received = segment.feed.received
            return received[-1] == positions[-1]["key"] if received else segment.seq_lo >= positions[-1]["last"]

        deadline = now() + 30
        while now() < deadline:
            if all(caught_up(s) for s in self.segments if s.closed is None and not s.feed._task.done()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # a duplicate after the last would show now

    # --- resolving what the clients could not know -------------------------------------------------------------

    async def resolve(self) -> None:
        """Asks the service, as a client would, about every operation: final states and unknown outcomes."""
        masters = [f"c{i}" for i in range(1, self.customers + 1)]
        withdrawals, orders, collections = {}, {}, {}
        for who in masters:
            for record in await self.settled_call(who, "withdraw_history", {"limit": 1000}):
                withdrawals[record.get("withdrawOrderId")] = record
            for record in await self.settled_call(who, "fund_record", {"size": 100}):
                collections[record["clientRequestId"]] = record
        for who in [*masters, "cycler", "witness"]:
            page = 1
            while True:
                envelope = await self.settled_call(who, "orders", {"page": page, "size": 100})
                for order in envelope.get("data") or []:
                    orders.setdefault(order["quoteId"], []).append(order)
                if page * 100 >= int(envelope.get("total") or 0):
                    break
                page += 1
        self.api_orders = orders
        for move in self.moves.values():
            if move.kind == "transfer" and move.state == "unknown":
                data = await self.settled_call(move.signer, "transfer_query", {"client_transfer_id": move.ident})
                move.state = "resolved done" if int(data["meta"]["total_count"]) == 1 else "resolved not done"
            elif move.kind == "universal" and move.state == "unknown":
                asked = {k: v for k, v in move.params.items() if k in ("clientTranId", "fromEmail")}
                data = await self.settled_call(move.signer, "universal_history", asked)
                move.state = (
                    "resolved done"
                    if [r for r in data["result"] if r.get("status") == "success"]
                    else "resolved not done"
                )
            elif move.kind == "sub_to_master" and move.state == "unknown":
                data = await self.settled_call(move.signer, "sub_history", {"clientTranId": move.ident, "type": 2})
                move.state = (
                    "resolved done"
                    if [r for r in data["result"] if r.get("status") == "success"]
                    else "resolved not done"
                )
            elif move.kind == "convert":
                found = orders.get(move.ident, [])
                if len(found) > 1:
                    self.violations.append(f"quote {move.ident} made {len(found)} orders")
                final = found[0]["status"] if found else None
                if move.state == "acked" and final != "SUCCESS":
                    self.violations.append(f"order of quote {move.ident} acknowledged, final status {final}")
                if move.state in ("unknown", "refused"):
                    if move.state == "refused" and final not in (None, "FAILED"):
                        self.violations.append(f"quote {move.ident}'s accept was refused, yet it has an order {final}")
                    move.state = "resolved done" if final == "SUCCESS" else "resolved not done"
            elif move.kind == "withdrawal":
                record = withdrawals.get(move.ident)
                if move.state == "acked" and record is None:
                    self.violations.append(f"withdrawal {move.ident} acknowledged, not in the history")
                if move.state == "refused" and record is not None:
                    self.violations.append(f"withdrawal {move.ident} was refused, yet it exists")
                if record is not None and record["status"] == 1:
                    amount = Decimal(record["amount"]) + Decimal(record["transactionFee"])
                    move.legs = [(move.signer, record["coin"], -amount)]
                elif record is not None and record["status"] != 2:
                    self.violations.append(f"withdrawal {move.ident} not final: status {record['status']}")
                if move.state == "unknown":
                    move.state = "resolved done" if record is not None else "resolved not done"
            elif move.kind == "collect":
                record = collections.get(move.ident)
                if move.state == "acked" and record is None:
                    self.violations.append(f"collection {move.ident} acknowledged, not in the records")
                if record is not None:
                    move.legs = await asyncio.to_thread(self.collection_legs, move)
                if move.state == "unknown":
                    move.state = "resolved done" if record is not None else "resolved not done"
        for quote in self.expired_quotes:  # a refused accept is recorded as a FAILED order, nothing more
            done = [o["status"] for o in orders.get(quote["quoteId"], []) if o["status"] != "FAILED"]
            if done:
                self.violations.append(f"the expired quote {quote['quoteId']} has an order {done}")
        self.credited = {}
        for who in self.signers:
            records = await self.deposit_records(who)
            for record in records:
                self.credited.setdefault(record["txId"], []).append((who, record))

    async def deposit_records(self, who: str) -> list[dict]:
        if who.endswith(".sub"):
            return await self.settled_call(
                who.split(".")[0], "sub_deposit_history", {"email": self.emails[who], "limit": 1000}
            )
        return await self.settled_call(who, "deposit_history", {"limit": 1000})

    def collection_legs(self, move: Move) -> list[tuple[str, str, Decimal]]:
        """What a collection moved: its postings' entries for the master and its sub-account (the
        amounts are the sub-account's balance when it ran: the server's to know)."""
        master, sub = move.signer, f"{move.signer}.sub"
        rows = self.book.rows(
            "SELECT e.account_id, a.code, sum(e.side * e.amount) FROM accounts_entry e"
            " JOIN accounts_posting p ON p.id = e.posting_id JOIN accounts_asset a ON a.id = e.asset_id"
            " JOIN subaccounts_fundcollection c ON p.reference LIKE 'fund-collect:' || c.id || ':%%'"
            " WHERE c.client_request_id = %s AND c.master_id = %s AND e.account_id = ANY(%s)"
            " GROUP BY e.account_id, a.code",
            [move.ident, self.ids[master], [self.ids[master], self.ids[sub]]],
        )
        names = {self.ids[master]: master, self.ids[sub]: sub}
        return [(names[account], code, Decimal(total)) for account, code, total in rows if total]

    # --- the end checks ---------------------------------------------------------------------------------

    def expected_balances(self) -> tuple[dict, Counter]:
        expected = {who: {a: total for a, (total, _) in self.start_balances[who].items()} for who in self.signers}
        counted: Counter = Counter()
        for move in self.moves.values():
            if move.state in ("acked", "resolved done"):
                counted[move.kind] += 1
                for who, asset, delta in move.legs:
                    expected[who][asset] = expected[who].get(asset, Decimal(0)) + delta
        for deposit in self.deposits:
            seen = self.credited.get(deposit["tx"], [])
            credited = [r for w, r in seen if w == deposit["who"] and r["status"] == 1]
            if len(seen) != 1 or len(credited) != 1:
                self.violations.append(
                    f"deposit {deposit['tx']} to {deposit['who']}: records {[(w, r['status']) for w, r in seen]}"
                )
            if credited:
                counted["deposit"] += 1
                if Decimal(credited[0]["amount"]) != deposit["amount"]:
                    self.violations.append(
                        f"deposit {deposit['tx']} credited {credited[0]['amount']}, sent {deposit['amount']}"
                    )
                expected[deposit["who"]][deposit["coin"]] = expected[deposit["who"]].get(
                    deposit["coin"], Decimal(0)
                ) + Decimal(credited[0]["amount"])
        return expected, counted

    def check_balances(self):
        expected, counted = self.expected_balances()
        wrong = []
        for who in self.signers:
            end = self.end_balances[who]
            for asset in sorted({*expected[who], *end}):
                want = expected[who].get(asset, Decimal(0))
                got, locked = end.get(asset, (Decimal(0), Decimal(0)))
                if want != got:
                    wrong.append(f"{who} {asset}: expected {want}, the service says {got} (difference {got - want})")
                if locked:
                    wrong.append(f"{who} {asset}: {locked} still locked after everything settled")
        accounts = len(self.signers)
        detail = (
            f"{accounts} accounts x assets: every balance = start + acknowledged operations {dict(counted)}"
            if not wrong
            else f"{len(wrong)} balances differ:\n      " + "\n      ".join(wrong[:20])
        )
        return chaos.Check("balances", not wrong, detail)

    def check_streams(self):
        lines, ok = [], True
        for segment in self.segments:
            chaos.judge_segment(self.positions[segment.account], segment)
            ok = ok and segment.ok
            end = f"closed by the server ({segment.closed_with})" if segment.closed else "to the end"
            if not segment.ok or segment.closed:
                lines.append(f"{segment.account} {end}: {'ok' if segment.ok else 'BROKEN'}: {segment.verdict}")
        stayed = [s for s in self.segments if s.closed is None]
        frames = sum(len(s.feed.received) for s in self.segments)
        detail = (
            f"{len(self.segments)} connections on {self.customers} listenKeys ({len(stayed)} to the end, "
            f"{len(self.segments) - len(stayed)} closed by the server and replaced), {frames} positions received: "
            + ("every change exactly once and in order" if ok else "BROKEN")
            + ("\n      " + "\n      ".join(lines) if lines else "")
        )
        return chaos.Check("streams", ok and len(stayed) == self.customers, detail)

    def check_answers(self):
        breaking = [a for a in self.answers if a.breaks_a_rule]
        detail = f"{len(self.answers)} requests {chaos.tally(self.answers)}"
        if breaking:
            detail += f"; BREAKING THE RULES {chaos.tally(breaking)}: " + ", ".join(
                f"{a.kind} {a.ident}" for a in breaking[:10]
            )
        return chaos.Check("answers", not breaking, detail)


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


def run(seed: int, minutes: float, *, customers: int = 4, out=None, keep: bool = False) -> SimulationResult:
    out = out or sys.stdout
    base = Path(tempfile.mkdtemp(prefix="simulate-"))
    sim = Simulation(seed, minutes, customers, out)
    checks = []
    try:
        sim.start(base)
        asyncio.run(sim.drive())
        ledger = chaos.manage(sim.env, "ledger_check")
        text = (ledger.stdout + ledger.stderr).strip()
        checks = [
            chaos.Check(
                "ledger_check", ledger.returncode == 0, text.splitlines()[-1] if text else f"exit {ledger.returncode}"
            ),
            sim.check_balances(),
            sim.check_streams(),
            sim.check_answers(),
            sim.check_convert_pnl(),
            sim.check_cycles(),
        ]
    except BaseException:
        out.write(f"simulate: the run itself failed; its files are in {base}\n")
        raise
    finally:
        sim.stop()
    problems = [f"{c.name}: {c.detail.splitlines()[0]}" for c in checks if not c.ok] + sim.violations
    lines = [
        f"simulate: seed {seed}, {minutes:g} minutes, {customers} customers; "
        f"schedule {digest(sim.ops, sim.fault_plan)}",
        "operations (what the clients saw):",
    ]
    for kind in sorted(sim.outcomes):
        lines.append(f"  {kind}: {sum(sim.outcomes[kind].values())} {dict(sim.outcomes[kind])}")
    lines.append(
        "faults injected: "
        + (", ".join(f"{n} x{c}" for n, c in Counter(f["name"] for f in sim.faults).items()) or "none")
    )
    for i, fault in enumerate(sim.faults, start=1):
        lines.append(
            f"  [{i}] +{fault['start'] - sim.t0:.1f} s {fault['name']} ({fault['end'] - fault['start']:.1f} s): "
            + "; ".join(fault["steps"])
        )
    states = Counter(f"{m.kind} {m.state}" for m in sim.moves.values())
    lines.append(f"client ids by outcome: {dict(sorted(states.items()))}")
    lines.append(f"deposits sent on the chain: {len(sim.deposits)}")
    lines.append("end checks:")
    for check in checks:
        lines.append(f"  {'ok    ' if check.ok else 'BROKEN'} {check.name}: {check.detail}")
    statuses = chaos.nginx_statuses(sim.run_dir)
    lines.append(
        f"nginx access log: {sum(statuses.values())} requests, "
        f"5xx {({s: n for s, n in statuses.items() if s.startswith('5')}) or 'none'}"
    )
    counts, _, blocks = chaos.stack_log_findings(sim.run_dir / "stack.log")
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
    operations = {kind: dict(counter) for kind, counter in sim.outcomes.items()}
    return SimulationResult(
        seed, digest(sim.ops, sim.fault_plan), not problems, report, operations, sim.faults, checks, problems
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--customers", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the logs in the temporary directory")
    options = parser.parse_args(argv)
    return 0 if run(options.seed, options.minutes, customers=options.customers, keep=options.keep).ok else 1


if __name__ == "__main__":
    sys.exit(main())
