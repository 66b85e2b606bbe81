"""Frames written straight to a Daphne connection's socket, framed once per event for everybody.

A websocket frame from the server is the same bytes on every connection (RFC 6455: server frames
are not masked; Daphne negotiates no compression), so the hub frames each posting's events once
(`text_frames`) and each connection writes those bytes to its Twisted transport: no ASGI message,
no `Server.handle_reply`, no autobahn `sendMessage` per connection and frame (about two thirds of
what a frame cost Daphne, bench/stream_fanout). Writes are whole frames, in the order made, on the
event loop that Daphne's own writes use, so they interleave with Daphne's (accept, answers, pings,
close) at frame boundaries only.

`Wire.of(send)` recognises Daphne's `send` (a partial of `Server.handle_reply` with the connection's
protocol); with any other server (channels' test communicator, another ASGI server) it answers None
and the consumer sends through ASGI as before. tests/streams/test_wire.py fails when the Daphne,
autobahn or Twisted internals it relies on change.

A `Wire` also knows how late its connection is: what it wrote that the client's TCP has not yet
acknowledged (in Twisted's buffer, or in the kernel's send queue: a client that reads slower than
its events come, or a process too busy to write), as the age of the oldest byte still waiting and
the frames still waiting (`lag`). What the client's own receive buffer holds counts as delivered.
"""

from __future__ import annotations

import fcntl
import functools
import struct
import termios
import time
from collections import deque

# Marks closer together than this share one (the lag is known to this resolution).
MARK_SECONDS = 0.02


def text_frame(text: str) -> bytes:
    """One final, unmasked text frame (RFC 6455 5.2) carrying `text`."""
    payload = text.encode("utf-8")
    size = len(payload)
    if size <= 125:
        return bytes((0x81, size)) + payload
    if size <= 0xFFFF:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


def text_frames(texts: list[str]) -> bytes:
    return b"".join(text_frame(text) for text in texts)


def _pending_bytes(transport) -> int:
    """Bytes accepted by Twisted's transport (abstract.FileDescriptor) and not yet written."""
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


def _unacknowledged_bytes(transport) -> int:
    """Bytes in the kernel's send queue not yet acknowledged by the client's TCP (Linux SIOCOUTQ; 0
    where unknown): a client that stops reading fills its receive window, then this queue."""
    try:
        return struct.unpack("i", fcntl.ioctl(transport.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (AttributeError, OSError, ValueError):
        return 0


class Wire:
    """Direct writes to one Daphne websocket connection, and how far behind they are."""

    __slots__ = ("frames", "frames_out", "marks", "protocol", "transport", "written")

    def __init__(self, protocol) -> None:
        self.protocol = protocol
        self.transport = protocol.transport
        self.written = 0  # bytes written through this wire
        self.frames = 0  # frames written through this wire
        self.frames_out = 0  # frames written by the last mark that is all out
        # (monotonic time, bytes written, frames written) when marked: the oldest mark whose bytes
        # are not all out yet dates the oldest frame still waiting (to MARK_SECONDS).
        self.marks: deque[tuple[float, int, int]] = deque()

    @classmethod
    def of(cls, send) -> Wire | None:
        """The wire of Daphne's connection behind an ASGI `send`, or None (not Daphne, compression
        negotiated, or internals not as expected)."""
        if not isinstance(send, functools.partial) or len(send.args) != 1:
            return None
        try:
            from daphne.server import Server
            from daphne.ws_protocol import WebSocketProtocol
        except ImportError:  # pragma: no cover - daphne is a requirement
            return None
        protocol = send.args[0]
        handler = getattr(send.func, "__func__", None)
        if handler is not Server.handle_reply or not isinstance(protocol, WebSocketProtocol):
            return None
        if getattr(protocol, "_perMessageCompress", True) is not None:
            return None  # compressed frames differ per connection: autobahn frames them
        transport = getattr(protocol, "transport", None)
        try:
            _pending_bytes(transport)
        except (AttributeError, TypeError):
            return None
        return cls(protocol)

    def write(self, data: bytes, count: int) -> bool:
        """Write `count` frames framed as `data` (False: the connection is no longer open)."""
        protocol = self.protocol
        transport = self.transport
        if protocol.state != protocol.STATE_OPEN or transport.disconnected:
            return False  # closing: nothing more goes out
        if protocol.send_queue:
            protocol.sendData(data)  # autobahn is queueing its own writes (chopped): behind them
        elif (
            transport.connected
            and not transport.disconnecting
            and not transport._writeDisconnected
            and not transport.TLS
            and not transport._tempDataLen
            and transport.offset == len(transport.dataBuffer)
        ):
            # Nothing waits in Twisted's buffer: send now, as asyncio's transports do, and leave
            # only what the socket did not take to Twisted (which then waits for it to be writable).
            # Twisted's own write would register for writability, send on the next loop turn and
            # unregister: two epoll_ctl calls and its write path per connection and posting.
            try:
                sent = transport.socket.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = 0  # Twisted's write meets the same error and closes the connection its way
            if sent < len(data):
                transport.write(data[sent:] if sent else data)
        else:
            transport.write(data)
        self.written += len(data)
        self.frames += count
        now = time.monotonic()
        marks = self.marks
        if marks and now - marks[-1][0] < MARK_SECONDS:
            at, _, _ = marks.pop()
            marks.append((at, self.written, self.frames))
        else:
            marks.append((now, self.written, self.frames))
        return True

    def lag(self) -> tuple[float, int]:
        """(seconds the oldest frame still in the server has waited, frames still in the server at
        most: those written since the last mark that is all out)."""
        try:
            out = self.written - _pending_bytes(self.transport) - _unacknowledged_bytes(self.transport)
        except (AttributeError, TypeError):
            return 0.0, 0
        marks = self.marks
        while marks and marks[0][1] <= out:
            self.frames_out = marks.popleft()[2]
        if not marks:
            return 0.0, 0
        return time.monotonic() - marks[0][0], self.frames - self.frames_out
