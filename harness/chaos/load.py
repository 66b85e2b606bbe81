"""The chaos run's load: signed transfer clients, withdrawals, universal transfers and collections,
websocket listeners on the peer's listenKey, and the database read from the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from decimal import Decimal

import psycopg

from harness import client
from harness.chaos.records import (
    CLIENT_RATE,
    COLLECT,
    ETH_ADDRESS,
    FINAL_COLLECTION,
    FINAL_WITHDRAWAL,
    LISTEN_KEY,
    TRANSFER,
    UNIVERSAL,
    WITHDRAW,
    Answer,
    PositionFeed,
    Record,
    Segment,
    now,
    send,
)
from harness.ports import HOST
from harness.private import Stack


class Load:
    """The clients of a run against `stack` (its port and its database), as the demo world's master
    and peer (`world`: their emails and keys), every answer recorded in `record`."""

    def __init__(self, stack: Stack, record: Record, world: dict) -> None:
        self.stack, self.record, self.world = stack, record, world
        self.seed = record.seed
        self.port = stack.port
        self.counter = itertools.count()
        self.ids = {
            role: stack.book.one("SELECT id FROM accounts_user WHERE email = %s", [world[role]["email"]])[0]
            for role in ("master", "peer")
        }
        self.signers = {
            role: client.Signer(world[role]["api_key"], world[role]["secret_key"]) for role in ("master", "peer")
        }

    # --- requests ---------------------------------------------------------------------------------

    async def call(
        self, conn: client.HttpConnection, role: str, method: str, path: str, params: dict, *, kind: str, ident: str
    ) -> Answer:
        signer = self.signers[role]
        started = now()
        status, body, hung = await send(conn, method, f"{path}?{signer.signed(params)}", signer.api_key)
        answer = Answer(kind, ident, role, started, now(), status, hung=hung)
        if status is not None:
            data = None
            with contextlib.suppress(ValueError):
                data = json.loads(body)
            if not isinstance(data, dict):
                data = {}
            if status != 200:
                answer.code = data.get("code")
            elif kind == "transfer":
                answer.ref = str(data.get("transfer", {}).get("id"))
            elif kind == "withdrawal":
                answer.ref = str(data.get("id"))
            elif kind == "universal":
                answer.ref = "true" if data.get("result") else "false"
            elif kind == "collection":
                answer.ref = data.get("status")
        self.record.answers.append(answer)
        return answer

    async def signed(self, role: str, method: str, path: str, params: dict) -> tuple[int | None, dict, str]:
        """One signed request on its own connection, not recorded: (status, body, the signed query sent)."""
        query = self.signers[role].signed(params)
        status, body = await self.send_again(role, method, path, query)
        data = {}
        with contextlib.suppress(ValueError):
            data = json.loads(body) if body else {}
        return status, data if isinstance(data, dict) else {}, query

    async def send_again(self, role: str, method: str, path: str, query: str) -> tuple[int | None, bytes]:
        """A signed query (`signed`'s) sent as it is on its own connection, with `role`'s API key."""
        conn = client.HttpConnection(HOST, self.port)
        try:
            status, body, _hung = await send(conn, method, f"{path}?{query}", self.signers[role].api_key)
        finally:
            await conn.close()
        return status, body

    async def transfer_client(self, index: int, stopping: asyncio.Event) -> None:
        role, other = ("master", "peer") if index % 2 == 0 else ("peer", "master")
        target = self.world[other]["email"]
        conn = client.HttpConnection(HOST, self.port)
        pace = 1.0 / CLIENT_RATE
        try:
            while not stopping.is_set():
                n = next(self.counter)
                ident = f"chaos{self.seed}-t{n}"
                # A unique amount per request: the peer's balance after each posting tells it apart.
                amount = Decimal("0.01") + Decimal(n) * Decimal("0.000001")
                params = {
                    "account": "USDT",
                    "target_address": target,
                    "amount": f"{amount:f}",
                    "client_transfer_id": ident,
                }
                started = now()
                answer = await self.call(conn, role, "POST", TRANSFER, params, kind="transfer", ident=ident)
                if answer.status is None:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(max(0.0, pace - (now() - started)))
        finally:
            await conn.close()

    async def withdraw(self, n: int) -> Answer:
        conn = client.HttpConnection(HOST, self.port)
        try:
            ident = f"cw{self.seed}-{n}"[:30]
            params = {
                "coin": "ETH",
                "network": "ETH",
                "address": ETH_ADDRESS,
                "amount": "0.01",
                "withdrawOrderId": ident,
            }
            return await self.call(conn, "master", "POST", WITHDRAW, params, kind="withdrawal", ident=ident)
        finally:
            await conn.close()

    async def collect(self, n: int) -> tuple[Answer, Answer]:
        """A universal transfer master -> sub1 (so there is something to collect), then a collection."""
        conn = client.HttpConnection(HOST, self.port)
        try:
            ident = f"chaos{self.seed}-u{n}"
            params = {"toEmail": self.world["sub"]["email"], "asset": "USDT", "amount": "1", "clientTranId": ident}
            moved = await self.call(conn, "master", "POST", UNIVERSAL, params, kind="universal", ident=ident)
            ident = f"chaos{self.seed}-c{n}"
            params = {"clientRequestId": ident}
            return moved, await self.call(conn, "master", "POST", COLLECT, params, kind="collection", ident=ident)
        finally:
            await conn.close()

    async def money_out(self, stopping: asyncio.Event) -> None:
        """A withdrawal every second; a universal transfer and a collection every third second."""
        for n in itertools.count():
            if stopping.is_set():
                return
            started = now()
            jobs = [self.withdraw(n)]
            if n % 3 == 0:
                jobs.append(self.collect(n))
            await asyncio.gather(*jobs)
            await asyncio.sleep(max(0.0, 1.0 - (now() - started)))

    async def burst(self) -> None:
        """Work for the worker right before it is killed: 4 withdrawals and a collection."""
        base = 100000 + len(self.record.faults) * 100
        await asyncio.gather(*[self.withdraw(base + i) for i in range(4)], self.collect(base))

    # --- the database, from the loop ------------------------------------------------------------------

    async def rows(self, sql: str, args=None) -> list[tuple]:
        return await asyncio.to_thread(self.stack.book.rows, sql, args)

    async def peer_seq(self) -> int:
        """The peer's change-feed sequence; waits while the database is away."""
        while True:
            try:
                return (
                    await self.rows("SELECT seq FROM accounts_ledgeraccount WHERE user_id = %s", [self.ids["peer"]])
                )[0][0]
            except psycopg.Error:
                await asyncio.sleep(0.5)

    async def open_work(self) -> dict[str, list]:
        """Our withdrawals and collections not final yet: {"withdrawals": [(id, stage)], ...}."""
        withdrawals = await self.rows(
            "SELECT id, stage FROM wallet_withdrawal WHERE withdraw_order_id LIKE %s AND NOT stage = ANY(%s)"
            " ORDER BY id",
            [f"cw{self.seed}-%", list(FINAL_WITHDRAWAL)],
        )
        collections = await self.rows(
            "SELECT id, status FROM subaccounts_fundcollection WHERE client_request_id LIKE %s"
            " AND NOT status = ANY(%s) ORDER BY id",
            [f"chaos{self.seed}-c%", list(FINAL_COLLECTION)],
        )
        return {"withdrawals": withdrawals, "collections": collections}

    # --- websockets -----------------------------------------------------------------------------------

    async def listen_key(self) -> str | None:
        """POST /openapi/v1/userDataStream with the peer's key (recorded like every request); the
        listenKey, or None when refused."""
        conn = client.HttpConnection(HOST, self.port)
        started = now()
        try:
            status, body, hung = await send(conn, "POST", LISTEN_KEY, self.signers["peer"].api_key)
        finally:
            await conn.close()
        answer = Answer("listenkey", "", "peer", started, now(), status, hung=hung)
        self.record.answers.append(answer)
        with contextlib.suppress(ValueError, AttributeError, KeyError):
            data = json.loads(body)
            if status == 200:
                return data["listenKey"]
            answer.code = data.get("code")
        return None

    async def listener_slot(self, slot: int, stop: asyncio.Event) -> None:
        """One websocket on the peer's listenKey for the whole run; connects again (asking for the
        listenKey again) whenever the server closes it."""
        while not stop.is_set():
            lo = await self.peer_seq()
            key = await self.listen_key()
            if key is None:
                await asyncio.sleep(0.5)
                continue
            feed = PositionFeed(f"ws://{HOST}:{self.port}/openapi/ws/{key}")
            try:
                await feed.start()
            except Exception as exc:  # noqa: BLE001 - refused at the handshake or unreachable: try again
                status = getattr(getattr(exc, "response", None), "status_code", None)
                self.record.handshake_refusals[f"HTTP {status}" if status else type(exc).__name__] += 1
                await asyncio.sleep(0.5)
                continue
            segment = Segment(slot, lo, await self.peer_seq(), now(), feed)
            self.record.segments.append(segment)
            if await segment.watch(stop):
                self.record.say(f"websocket {slot}: closed by the server ({segment.closed_with}); connecting again")
                await asyncio.sleep(0.2)
                continue
            await feed.stop()
