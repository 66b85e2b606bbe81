"""The simulation's operations: every flow a customer goes through, and
what each answer means for its client id."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import psycopg

from harness.chaos.records import now
from harness.private import Stack
from harness.simulation.moves import Move
from harness.simulation.plan import FOREIGN_IP, WHITELIST, Op, Window
from harness.simulation.world import Customers, SimRecord


class Flows:
    """The customers' operations (`accounts`' calls through the `stack`), each recorded with what its
    answer means for its client id in the `record`; the chain's deposits written to the stack's
    database."""

    def __init__(self, stack: Stack, accounts: Customers, record: SimRecord) -> None:
        self.stack, self.accounts, self.record = stack, accounts, record
        self.addresses: dict[tuple, tuple[str, str]] = {}
        self.key_locks: dict[int, asyncio.Lock] = {}

    def _move(self, op: Op, kind: str, ident: str, legs, signer: str) -> Move:
        move = self.record.moves[ident] = Move(kind, ident, legs, signer=signer)
        self.record.by_op[op.n] = move
        return move

    async def _first(self, op: Op, kind: str, ident: str, legs, signer: str, params: dict):
        """An operation with a client id, sent the first time (`kind` names its endpoint in PATHS):
        its Move, the answer and the body. A 200 with `result: false` is a refusal."""
        move = self._move(op, kind, ident, legs, signer)
        answer, data = await self.accounts.call(signer, kind, params, kind=kind, ident=ident)
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
        self.record.outcomes[kind][label] += 1

    def _restricted(self, who: str, answer) -> bool:
        """A sub-account's request that must have been refused by its key's IP restriction."""
        return any(
            w.account == who and w.start <= answer.started and answer.ended <= w.end for w in self.record.windows
        )

    def _check_restriction(self, who: str, answer) -> None:
        if answer.status == 200 and self._restricted(who, answer):
            self.record.violations.append(
                f"{who}'s key was restricted to {FOREIGN_IP}, yet {answer.kind} {answer.ident} got 200"
            )

    # --- operations ----------------------------------------------------------------------------------------

    async def op_transfer(self, op: Op) -> None:
        p, who, to = op.params, f"c{op.customer}", f"c{op.params['to']}"
        ident = f"s{self.record.seed}-t{op.n}"
        amount = Decimal(p["amount"])
        legs = [(who, p["asset"], -amount - self.accounts.fees.get(p["asset"], Decimal(0))), (to, p["asset"], amount)]
        params = {
            "account": p["asset"],
            "target_address": self.accounts.emails[to],
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
                params = {"email": self.accounts.emails[who], "coin": coin, "network": network}
                answer, data = await self.accounts.call(master, "sub_deposit_address", params, kind="deposit_address")
            else:
                answer, data = await self.accounts.call(
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
            self.record.outcomes["deposit"]["no address (refused or no answer)"] += 1
            return
        tx_id = f"sim{self.record.seed}d{op.n:06d}" + "0" * 40
        deadline = now() + 90
        while True:  # the outside world's chain: independent of our outages in reality, so it insists
            try:
                await asyncio.to_thread(
                    self.stack.book.rows,
                    "INSERT INTO wallet_simtransaction (network, tx_id, output_index, address, tag, amount,"
                    " block_height, incoming, fails) VALUES (%s, %s, 0, %s, %s, %s,"
                    " coalesce((SELECT height FROM wallet_simblockheight WHERE network = %s), 1), true, false)"
                    " RETURNING id",
                    [p["network"], tx_id, address[0], address[1], Decimal(p["amount"]), p["network"]],
                )
                break
            except psycopg.Error:
                if now() > deadline:
                    self.record.outcomes["deposit"]["chain unreachable"] += 1
                    return
                await asyncio.sleep(0.5)
        self.record.deposits.append(
            {"who": who, "coin": p["coin"], "network": p["network"], "tx": tx_id, "amount": Decimal(p["amount"])}
        )
        self.record.outcomes["deposit"]["sent on the chain"] += 1

    async def op_withdrawal(self, op: Op) -> None:
        p, who = op.params, f"c{op.customer}"
        ident = f"s{self.record.seed}w{op.n}"
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
        answer, data = await self.accounts.call(who, "quote", params, kind="quote")
        if answer.status == 200 and data.get("status") == 0:
            return data["data"]
        self.record.outcomes["quote refused"][
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
        answer, data = await self.accounts.call(who, "accept", {"quoteId": ident}, kind="convert", ident=ident)
        if answer.status == 200 and data.get("status") != 0:
            answer.code = data.get("status")
            move.state = "refused"
            self.record.outcomes["convert"][f"200 envelope {data.get('status')}"] += 1
            return
        move.answered(answer)
        self._outcome("convert", answer)

    async def op_quote_expiry(self, op: Op) -> None:
        p, who = op.params, f"c{op.customer}"
        quote = await self._quote(who, p)
        if quote is None:
            return
        await asyncio.sleep(int(quote["expiry"]) + 1.5)
        answer, data = await self.accounts.call(
            who, "accept", {"quoteId": quote["quoteId"]}, kind="quote_expiry", ident=quote["quoteId"]
        )
        refused = answer.status == 200 and data.get("status") == 10000003
        self.record.expired_quotes.append(
            {"who": who, "quoteId": quote["quoteId"], "answer": answer, "refused": refused}
        )
        self.record.outcomes["quote_expiry"]["refused 10000003" if refused else answer.label] += 1
        if answer.status == 200 and data.get("status") == 0:
            self.record.violations.append(
                f"{who} accepted quote {quote['quoteId']} {int(quote['expiry']) + 1.5:.1f} s after its expiry"
            )

    async def op_universal(self, op: Op) -> None:
        p, master = op.params, f"c{op.customer}"
        sub = f"{master}.sub"
        ident = f"s{self.record.seed}-u{op.n}"
        amount = Decimal(p["amount"])
        source, target = (master, sub) if p["to_sub"] else (sub, master)
        params = {"asset": p["asset"], "amount": p["amount"], "clientTranId": ident}
        params["toEmail" if p["to_sub"] else "fromEmail"] = self.accounts.emails[sub]
        legs = [(source, p["asset"], -amount), (target, p["asset"], amount)]
        await self._first(op, "universal", ident, legs, master, params)

    async def op_sub_to_master(self, op: Op) -> None:
        p, master = op.params, f"c{op.customer}"
        sub = f"{master}.sub"
        ident = f"s{self.record.seed}-m{op.n}"
        amount = Decimal(p["amount"])
        params = {"asset": p["asset"], "amount": p["amount"], "clientTranId": ident}
        legs = [(sub, p["asset"], -amount), (master, p["asset"], amount)]
        await self._first(op, "sub_to_master", ident, legs, sub, params)

    async def op_collect(self, op: Op) -> None:
        master = f"c{op.customer}"
        ident = f"s{self.record.seed}-c{op.n}"
        # legs from its postings at the end
        await self._first(op, "collect", ident, [], master, {"clientRequestId": ident})

    async def op_key_change(self, op: Op) -> None:
        """The master restricts its sub-account's key to a foreign IP; the sub-account's requests are
        refused from a second after the answer until the restriction is lifted."""
        master = f"c{op.customer}"
        sub = f"{master}.sub"
        lock = self.key_locks.setdefault(op.customer, asyncio.Lock())
        async with lock:
            base = {"apikey": self.accounts.signers[sub].api_key, "email": self.accounts.emails[sub]}
            answer, _ = await self.accounts.call(
                master, "restrict", {**base, "ipAddress": FOREIGN_IP, "ipRestriction": "1"}, kind="key_change"
            )
            self._outcome("key_change restrict", answer)
            window = None
            if answer.status == 200:
                window = Window(sub, answer.ended + 1.0)
                self.record.windows.append(window)
                await asyncio.sleep(1.2)
                probe, _ = await self.accounts.call(sub, "account", {}, kind="restricted_probe")
                self.record.outcomes["key_change probe (sub's own request)"][probe.label] += 1
                if probe.status == 200:
                    self.record.violations.append(
                        f"{sub}'s key restricted to {FOREIGN_IP} 1.2 s ago, yet its request got 200"
                    )
                await asyncio.sleep(max(0.0, op.params["hold"] - 1.2))
            # Lifted whatever the answer was (an unknown answer may have restricted it): until it is.
            for _ in range(60):
                if window is not None and window.end == float("inf"):
                    window.end = now()
                lifted, _ = await self.accounts.call(
                    master, "restrict", {**base, "ipRestriction": "2"}, kind="key_change"
                )
                cleared, _ = await self.accounts.call(
                    master, "unrestrict", {**base, "ipAddress": FOREIGN_IP}, kind="key_change"
                )
                if lifted.status == 200 and cleared.status is not None and cleared.status < 500:
                    self._outcome("key_change lift", lifted)
                    return
                await asyncio.sleep(1.0)
            self.record.violations.append(f"{sub}'s key restriction could not be lifted")

    async def op_again(self, op: Op) -> None:
        """A client id sent again (a fresh signature), or a signed request replayed byte for byte."""
        original = self.record.by_op.get(op.params["of"])
        if original is None:
            self.record.outcomes[op.kind]["original never sent"] += 1
            return
        await original.done.wait()
        if not original.query:
            self.record.outcomes[op.kind]["original never sent"] += 1
            return
        query = original.query if op.kind == "replay" else None
        before = original.state
        answer, data = await self.accounts.call(
            original.signer, original.kind, original.params, kind=op.kind, ident=original.ident, query=query
        )
        executed = answer.status == 200 and not (isinstance(data, dict) and data.get("result") is False)
        label = f"{answer.label} (original {before})"
        self.record.outcomes[f"{op.kind} of {original.kind}"][label] += 1
        if executed and before == "acked":
            what = "replayed signature" if op.kind == "replay" else "client id sent again"
            self.record.violations.append(f"{what} {original.ident} executed again: {answer.label}")
        elif executed:
            original.state = "acked"  # the first attempt did not run; this one did (counted once)
        elif answer.unknown and before != "acked":
            original.state = "unknown"
        self._check_restriction(original.signer, answer)
