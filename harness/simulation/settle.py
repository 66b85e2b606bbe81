"""After the load: the work in flight settled, and every outcome the clients could not know resolved
by asking the service with the client id."""

from __future__ import annotations

import asyncio
import contextlib
from decimal import Decimal

import psycopg

from harness.chaos.checks import account_positions
from harness.chaos.records import FINAL_COLLECTION, FINAL_WITHDRAWAL, now
from harness.private import Stack
from harness.simulation.moves import Move
from harness.simulation.plan import SETTLE_SECONDS
from harness.simulation.world import Customers, SimRecord


class Settle:
    """The end of a simulation's load: the work on the `stack` settled, the streams caught up and
    every outcome resolved by `accounts`' questions, into the `record`."""

    def __init__(self, stack: Stack, accounts: Customers, record: SimRecord) -> None:
        self.stack, self.accounts, self.record = stack, accounts, record

    async def settle_work(self) -> None:
        """Until every withdrawal and collection is final and every deposit sent is credited."""
        deadline = now() + SETTLE_SECONDS
        txs = [d["tx"] for d in self.record.deposits]
        while now() < deadline:
            with contextlib.suppress(psycopg.Error):
                open_ = await asyncio.to_thread(
                    self.stack.book.one,
                    "SELECT (SELECT count(*) FROM wallet_withdrawal WHERE withdraw_order_id LIKE %s"
                    "        AND NOT stage = ANY(%s)),"
                    " (SELECT count(*) FROM subaccounts_fundcollection WHERE client_request_id LIKE %s"
                    "        AND NOT status = ANY(%s)),"
                    " %s - (SELECT count(*) FROM wallet_deposit WHERE tx_id = ANY(%s) AND status = 1),"
                    " (SELECT count(*) FROM convert_order WHERE status = ANY(%s))",
                    [
                        f"s{self.record.seed}w%",
                        list(FINAL_WITHDRAWAL),
                        f"s{self.record.seed}-c%",
                        list(FINAL_COLLECTION),
                        len(txs),
                        txs,
                        ["TODO", "PROCESSING"],
                    ],
                )
                if not any(open_):
                    self.record.say(f"all work final {now() - self.record.load_end:.1f} s after the load")
                    return
            await asyncio.sleep(1.0)
        self.record.violations.append(
            f"work still open {SETTLE_SECONDS:.0f} s after the load "
            f"(withdrawals, collections, deposits, orders): {open_}"
        )

    async def settle_streams(self, masters: list[str]) -> None:
        await asyncio.sleep(1.5)
        self.record.positions = {
            who: await asyncio.to_thread(account_positions, self.stack.book, self.accounts.ids[who]) for who in masters
        }

        def caught_up(segment) -> bool:
            positions = self.record.positions[segment.account]
            if not positions:
                return True
            received = segment.feed.received
            return received[-1] == positions[-1]["key"] if received else segment.seq_lo >= positions[-1]["last"]

        deadline = now() + 30
        while now() < deadline:
            if all(caught_up(s) for s in self.record.segments if s.closed is None and not s.feed._task.done()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # a duplicate after the last would show now

    # --- resolving what the clients could not know -------------------------------------------------------------

    async def resolve(self) -> None:
        """Asks the service, as a client would, about every operation: final states and unknown outcomes."""
        masters = [f"c{i}" for i in range(1, self.record.customers + 1)]
        withdrawals, orders, collections = {}, {}, {}
        for who in masters:
            for record in await self.accounts.settled_call(who, "withdraw_history", {"limit": 1000}):
                withdrawals[record.get("withdrawOrderId")] = record
            for record in await self.accounts.settled_call(who, "fund_record", {"size": 100}):
                collections[record["clientRequestId"]] = record
        for who in [*masters, "cycler", "witness"]:
            page = 1
            while True:
                envelope = await self.accounts.settled_call(who, "orders", {"page": page, "size": 100})
                for order in envelope.get("data") or []:
                    orders.setdefault(order["quoteId"], []).append(order)
                if page * 100 >= int(envelope.get("total") or 0):
                    break
                page += 1
        self.record.api_orders = orders
        for move in self.record.moves.values():
            if move.kind == "transfer" and move.state == "unknown":
                data = await self.accounts.settled_call(
                    move.signer, "transfer_query", {"client_transfer_id": move.ident}
                )
                move.state = "resolved done" if int(data["meta"]["total_count"]) == 1 else "resolved not done"
            elif move.kind == "universal" and move.state == "unknown":
                asked = {k: v for k, v in move.params.items() if k in ("clientTranId", "fromEmail")}
                data = await self.accounts.settled_call(move.signer, "universal_history", asked)
                move.state = (
                    "resolved done"
                    if [r for r in data["result"] if r.get("status") == "success"]
                    else "resolved not done"
                )
            elif move.kind == "sub_to_master" and move.state == "unknown":
                data = await self.accounts.settled_call(
                    move.signer, "sub_history", {"clientTranId": move.ident, "type": 2}
                )
                move.state = (
                    "resolved done"
                    if [r for r in data["result"] if r.get("status") == "success"]
                    else "resolved not done"
                )
            elif move.kind == "convert":
                found = orders.get(move.ident, [])
                if len(found) > 1:
                    self.record.violations.append(f"quote {move.ident} made {len(found)} orders")
                final = found[0]["status"] if found else None
                if move.state == "acked" and final != "SUCCESS":
                    self.record.violations.append(f"order of quote {move.ident} acknowledged, final status {final}")
                if move.state in ("unknown", "refused"):
                    if move.state == "refused" and final not in (None, "FAILED"):
                        self.record.violations.append(
                            f"quote {move.ident}'s accept was refused, yet it has an order {final}"
                        )
                    move.state = "resolved done" if final == "SUCCESS" else "resolved not done"
            elif move.kind == "withdrawal":
                record = withdrawals.get(move.ident)
                if move.state == "acked" and record is None:
                    self.record.violations.append(f"withdrawal {move.ident} acknowledged, not in the history")
                if move.state == "refused" and record is not None:
                    self.record.violations.append(f"withdrawal {move.ident} was refused, yet it exists")
                if record is not None and record["status"] == 1:
                    amount = Decimal(record["amount"]) + Decimal(record["transactionFee"])
                    move.legs = [(move.signer, record["coin"], -amount)]
                elif record is not None and record["status"] != 2:
                    self.record.violations.append(f"withdrawal {move.ident} not final: status {record['status']}")
                if move.state == "unknown":
                    move.state = "resolved done" if record is not None else "resolved not done"
            elif move.kind == "collect":
                record = collections.get(move.ident)
                if move.state == "acked" and record is None:
                    self.record.violations.append(f"collection {move.ident} acknowledged, not in the records")
                if record is not None:
                    move.legs = await asyncio.to_thread(self.collection_legs, move)
                if move.state == "unknown":
                    move.state = "resolved done" if record is not None else "resolved not done"
        for quote in self.record.expired_quotes:  # a refused accept is recorded as a FAILED order, nothing more
            done = [o["status"] for o in orders.get(quote["quoteId"], []) if o["status"] != "FAILED"]
            if done:
                self.record.violations.append(f"the expired quote {quote['quoteId']} has an order {done}")
        self.record.credited = {}
        for who in self.accounts.signers:
            records = await self.deposit_records(who)
            for record in records:
                self.record.credited.setdefault(record["txId"], []).append((who, record))

    async def deposit_records(self, who: str) -> list[dict]:
        if who.endswith(".sub"):
            return await self.accounts.settled_call(
                who.split(".")[0], "sub_deposit_history", {"email": self.accounts.emails[who], "limit": 1000}
            )
        return await self.accounts.settled_call(who, "deposit_history", {"limit": 1000})

    def collection_legs(self, move: Move) -> list[tuple[str, str, Decimal]]:
        """What a collection moved: its postings' entries for the master and its sub-account (the
        amounts are the sub-account's balance when it ran: the server's to know)."""
        master, sub = move.signer, f"{move.signer}.sub"
        rows = self.stack.book.rows(
            "SELECT e.account_id, a.code, sum(e.side * e.amount) FROM accounts_entry e"
            " JOIN accounts_posting p ON p.id = e.posting_id JOIN accounts_asset a ON a.id = e.asset_id"
            " JOIN subaccounts_fundcollection c ON p.reference LIKE 'fund-collect:' || c.id || ':%%'"
            " WHERE c.client_request_id = %s AND c.master_id = %s AND e.account_id = ANY(%s)"
            " GROUP BY e.account_id, a.code",
            [move.ident, self.accounts.ids[master], [self.accounts.ids[master], self.accounts.ids[sub]]],
        )
        names = {self.accounts.ids[master]: master, self.accounts.ids[sub]: sub}
        return [(names[account], code, Decimal(total)) for account, code, total in rows if total]
