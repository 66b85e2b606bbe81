"""What the chaos run records: every answer the clients saw, each websocket connection, each fault,
the final checks' results; and one request with its time bound."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from websockets.exceptions import ConnectionClosed

from harness import client

CLIENTS = 8
LISTENERS = 3
CLIENT_RATE = 10.0  # transfers a second per client (80 in all): leaves room for the faults on 2 cores
HUNG_SECONDS = 30.0  # a request without an answer this long is hung
RECOVERY_SECONDS = 60.0  # after a fault's end, a 200 within this long
SETTLE_SECONDS = 150.0  # at the end, withdrawals and collections final within this long
AFTER_SECONDS = 8.0  # load watched after each fault before the next one (recovery took 0.02-2 s: 2026-11-29)
WARMUP_SECONDS = 3.0
TRANSFER = "/openapi/transfer/v4/transfers"
TRANSFER_QUERY = "/openapi/transfer/v3/transfers"
WITHDRAW = "/openapi/wallet/v1/withdraw/apply"
UNIVERSAL = "/openapi/v1/sub-account/transfer/universal-transfer"
COLLECT = "/openapi/v1/fund-collect/collect-from-sub-account"
LISTEN_KEY = "/openapi/v1/userDataStream"
ETH_ADDRESS = "0x00000000000000000000000000000000000d3e40"  # the demo master's ETH whitelist entry
FINAL_WITHDRAWAL = ("SUCCEEDED", "FAILED")
FINAL_COLLECTION = ("SUCCESS", "PARTIAL_SUCCESS", "FAILED")


def now() -> float:
    return time.monotonic()


class Record:
    """What a run saw, shared by its load, its faults, its checks and its report: every answer, each
    websocket connection (segment), each fault, the listeners' refused handshakes, the unknown outcomes
    resolved; the moment the load started (`t0`) and ended (`load_end`); `say` prints a line of the
    run's log, with its time since `t0`."""

    def __init__(self, seed: int, out, name: str = "chaos") -> None:
        self.seed, self.out, self.name = seed, out, name
        self.answers: list[Answer] = []
        self.segments: list[Segment] = []
        self.faults: list[Fault] = []
        self.handshake_refusals: Counter = Counter()
        self.resolved: dict[str, int | None] = {}
        self.t0 = now()
        self.t0_clock = time.strftime("%H:%M:%S")
        self.load_end = 0.0

    def say(self, text: str) -> None:
        self.out.write(f"[{self.name} +{now() - self.t0:6.1f}s] {text}\n")
        self.out.flush()

    def rel(self, moment: float) -> str:
        """A moment as seconds since the load started."""
        return f"{moment - self.t0:+.1f} s"

    def load_started(self) -> None:
        self.t0, self.t0_clock = now(), time.strftime("%H:%M:%S")

    def load_stopped(self) -> None:
        self.load_end = now()


# --- what the clients saw ----------------------------------------------------------------------------


@dataclass
class Answer:
    """One request and what came back; status None: no answer (connection broken, or hung)."""

    kind: str  # transfer, withdrawal, universal, collection
    ident: str  # the client's id of the request (client_transfer_id, withdrawOrderId, ...)
    role: str  # demo account that sent it
    started: float
    ended: float
    status: int | None
    code: int | None = None
    ref: str | None = None  # what a 200 answered: the transfer's or withdrawal's id, the collection's status
    hung: bool = False
    query: str = ""  # the signed query text sent (the simulation replays it)

    @property
    def label(self) -> str:
        if self.status is None:
            return "hung" if self.hung else "no answer"
        return "200" if self.status == 200 else f"{self.status}/{self.code}"

    @property
    def unknown(self) -> bool:
        """The client cannot know whether it was executed: no answer, or a server error."""
        return self.status is None or self.status >= 500

    @property
    def breaks_a_rule(self) -> bool:
        """An answer the service must never give: a 5xx other than 503 -1001 (or, for a listenKey,
        503 -1126, docs/streams.md), e.g. a 500 -1000 (a traceback), or none within HUNG_SECONDS."""
        if self.hung:
            return True
        allowed = {(503, -1001), (503, -1126)} if self.kind == "listenkey" else {(503, -1001)}
        return self.status is not None and self.status >= 500 and (self.status, self.code) not in allowed


def tally(answers: list[Answer]) -> str:
    counts = Counter(a.label for a in answers)
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + "}" if counts else "{}"


class PositionFeed(client.Listener):
    """harness/client.py's Listener keeping each outboundAccountPosition whole: (u, ((asset, free,
    locked), ...)), the key the change feed is matched with."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.received: list[tuple] = []
        self.error: str | None = None

    async def _run(self) -> None:
        try:
            async for raw in self._ws:
                event = json.loads(raw)
                if event.get("e") == "outboundAccountPosition":
                    balances = tuple((b["a"], Decimal(b["f"]), Decimal(b["l"])) for b in event["B"])
                    self.received.append((int(event["u"]), balances))
        except ConnectionClosed as exc:
            self.closed_with = exc.rcvd.code if exc.rcvd else 1006
        except Exception as exc:  # noqa: BLE001 - any end of the connection is recorded
            self.error = repr(exc)
        else:
            self.closed_with = self._ws.close_code


@dataclass
class Segment:
    """One websocket connection of a listener slot: the peer's feed sequence read just before it
    connected (lo) and just after the handshake (hi): the server's starting point lies between."""

    slot: int
    seq_lo: int
    seq_hi: int
    opened: float
    feed: PositionFeed
    closed: float | None = None  # set when the server closed it (not us at the end)
    closed_with: str = ""
    verdict: str = ""
    ok: bool = True
    account: str = ""  # whose listenKey (the simulation: one slot per customer)

    async def watch(self, stop: asyncio.Event) -> bool:
        """Wait until `stop` is set or the server closes the connection; True (and the close noted)
        when the server closed it: the caller connects again."""
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({self.feed._task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if self.feed._task.done() and not stop.is_set():
            self.closed = now()
            feed = self.feed
            self.closed_with = str(feed.closed_with) if feed.closed_with is not None else (feed.error or "?")
            return True
        return False


@dataclass
class Fault:
    name: str
    start: float = 0.0  # the outage window, time.monotonic()
    end: float = 0.0
    until: float = 0.0  # watched after the window until then (the next fault, or the end of the load)
    steps: list[str] = field(default_factory=list)
    in_flight: dict[str, list] = field(default_factory=dict)  # withdrawals / collections not final at the kill
    settled_after: float | None = None  # seconds from the kill until all of them were final
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ChaosResult:
    seed: int
    faults: list[Fault]
    checks: list[Check]
    problems: list[str]
    report: str
    answers: list[Answer]
    segments: list[Segment]
    restarts: dict[str, int]
    log_dir: Path | None

    @property
    def ok(self) -> bool:
        return not self.problems


async def send(conn: client.HttpConnection, method: str, target: str, api_key: str) -> tuple[int | None, bytes, bool]:
    """One request on `conn`: (status, body, hung); status None when no answer came (the connection
    is closed then, so that the next request opens a new one)."""
    try:
        status, body = await asyncio.wait_for(conn.request(method, target, {"X-SERVICE-APIKEY": api_key}), HUNG_SECONDS)
        return status, body, False
    except TimeoutError:
        await conn.close()
        return None, b"", True
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError, IndexError):
        await conn.close()
        return None, b"", False
