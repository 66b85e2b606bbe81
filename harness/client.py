"""A load client of our own for the benchmarks that run against the stack `make run` starts: signed
HTTP/1.1 keep-alive clients on asyncio (a fresh timestamp and signature per request, as the official
connector sends them), websocket listeners that time every event, and small statistics helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlencode

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class HttpConnection:
    """One keep-alive HTTP/1.1 connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def request(self, method: str, target: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            await self._open()
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body or method in ("POST", "PUT", "DELETE"):
            lines += ["Content-Type: application/x-www-form-urlencoded", f"Content-Length: {len(body)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        try:
            return await self._response()
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.close()
            raise

    async def _response(self) -> tuple[int, bytes]:
        status_line = await self.reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, chunked, close = None, False, False
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.lower() == "close":
                close = True
        if chunked:
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                body += await self.reader.readexactly(size + 2)
                body = body[:-2]
        else:
            body = await self.reader.readexactly(length or 0)
        if close:
            await self.close()
        return status, body


@dataclass
class Signer:
    api_key: str
    secret: str
    last_ms: int = 0

    def signed(self, params: dict) -> str:
        """The query text with a fresh timestamp and its signature. The timestamp grows by at least
        one per request of this key: identical requests signed in the same millisecond would carry
        the same signature, which the service refuses as a replay (-1022)."""
        self.last_ms = max(int(time.time() * 1000), self.last_ms + 1)
        text = urlencode({**params, "recvWindow": 60000, "timestamp": self.last_ms})
        signature = hmac.new(self.secret.encode(), text.encode(), hashlib.sha256).hexdigest()
        return f"{text}&signature={signature}"


@dataclass
class Tally:
    """What the clients saw: statuses, error codes, latencies (ms) of successful requests."""

    statuses: Counter = field(default_factory=Counter)
    codes: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    broken: int = 0  # connections the server closed in the middle of a request

    def add(self, status: int, body: bytes, elapsed_ms: float) -> None:
        self.statuses[status] += 1
        if status == 200:
            self.latencies.append(elapsed_ms)
        else:
            with contextlib.suppress(Exception):
                self.codes[json.loads(body).get("code")] += 1

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def summary(self) -> str:
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(self.codes.items(), key=lambda i: str(i[0])))
        return f"statuses {{{statuses}}} error codes {{{codes or '-'}}} broken connections {self.broken}"


async def signed_loop(
    host: str,
    port: int,
    signer: Signer,
    make_params,
    tally: Tally,
    until: float,
    *,
    method: str = "POST",
    path: str = "/openapi/transfer/v4/transfers",
    pace: float | None = None,
) -> None:
    """Requests one after the other on one connection until `until` (time.monotonic); with `pace`,
    at most one every `pace` seconds."""
    conn = HttpConnection(host, port)
    headers = {"X-SERVICE-APIKEY": signer.api_key}
    n = 0
    try:
        while time.monotonic() < until:
            started = time.monotonic()
            query = signer.signed(make_params(n))
            n += 1
            try:
                status, body = await conn.request(method, f"{path}?{query}", headers)
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                tally.broken += 1
                await asyncio.sleep(0.05)
                continue
            tally.add(status, body, (time.monotonic() - started) * 1000)
            if pace is not None:
                await asyncio.sleep(max(0.0, pace - (time.monotonic() - started)))
    finally:
        await conn.close()


class Listener:
    """One websocket on a listenKey: every outboundAccountPosition's receipt time and its `u` (the
    posting's time, taken before the posting waited for its row locks and committed: receipt - u
    overstates commit-to-receipt by that wait)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.positions: list[tuple[float, int, dict]] = []  # (received ms, posting time u ms, balances)
        # received - E: E is when the websocket server's hub dispatched the posting (after its ordering),
        # so this is the server's fan-out and the network, and u..E the rest (locks, commit, publish).
        self.from_hub: list[float] = []
        self.updates = 0
        self.closed_with: int | None = None
        self._task: asyncio.Task | None = None
        self._ws = None

    async def start(self) -> None:
        self._ws = await connect(self.url, max_size=2**22, open_timeout=30)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for raw in self._ws:
                received = time.time() * 1000
                event = json.loads(raw)
                kind = event.get("e")
                if kind == "outboundAccountPosition":
                    self.positions.append((received, int(event["u"]), {b["a"]: b["f"] for b in event["B"]}))
                    self.from_hub.append(received - int(event["E"]))
                elif kind == "balanceUpdate":
                    self.updates += 1
        except ConnectionClosed as exc:
            self.closed_with = exc.rcvd.code if exc.rcvd else None

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5)
