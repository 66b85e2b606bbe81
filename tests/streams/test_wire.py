"""The stream's direct writes to Daphne's sockets (streams/wire.py) and the lag bound (4006) they
and the outbox are held to: frames made once are the bytes autobahn would have made, the lag is the
age of the oldest frame the client's TCP has not taken, and the Daphne, autobahn and Twisted
internals the writes rely on are still there (this fails when an upgrade changes them)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time

import pytest
from asgiref.sync import sync_to_async
from autobahn.websocket.protocol import PreparedMessage, WebSocketProtocol
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol as DaphneProtocol
from django.test import override_settings
from twisted.internet import abstract

from streams import services, watcher, wire
from streams.consumers import UserDataConsumer
from streams.hub.frames import Frames
from streams.wire import Wire, text_frame, text_frames
from tests.support.factories import deposit
from tests.support.streams import communicator

TOO_SLOW = {"type": "websocket.close", "code": 4006}


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_a_frame_is_what_autobahn_makes_for_a_server_text_message(size):
    text = "é" * (size // 2) + "x" * (size % 2)
    assert text_frame(text) == PreparedMessage(text.encode(), False, False, True).payloadHybi


def test_a_postings_frames_are_framed_once():
    frames = Frames(['{"e":"balanceUpdate"}', '{"e":"outboundAccountPosition"}'])
    assert frames.wire == text_frames(frames) == text_frame(frames[0]) + text_frame(frames[1])
    assert frames.wire is frames.wire
    assert frames == ['{"e":"balanceUpdate"}', '{"e":"outboundAccountPosition"}']


def test_the_internals_the_writes_rely_on_are_there():
    """Daphne hands each connection `partial(server.handle_reply, protocol)`; autobahn's protocol
    has its state, send queue and compression; Twisted's transport its write buffer."""
    assert "send=partial(self.handle_reply, protocol)" in inspect.getsource(Server.create_application)
    assert issubclass(DaphneProtocol, WebSocketProtocol)
    assert WebSocketProtocol.STATE_OPEN == 3
    assert "self._perMessageCompress = None" in inspect.getsource(WebSocketProtocol)
    assert "self.send_queue" in inspect.getsource(WebSocketProtocol)
    assert "self.send_queue.append((data, sync))" in inspect.getsource(WebSocketProtocol.sendData)
    descriptor = abstract.FileDescriptor()
    assert (descriptor.dataBuffer, descriptor.offset, descriptor._tempDataLen) == (b"", 0, 0)
    descriptor.startWriting = lambda: None
    descriptor.connected = True
    descriptor.write(b"abc")
    assert wire._pending_bytes(descriptor) == 3


class FakeSocket:
    def __init__(self, takes: int) -> None:
        self.takes = takes  # bytes the kernel takes per send (0: its buffer is full)
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        if not self.takes:
            raise BlockingIOError
        self.sent.append(data[: self.takes])
        return len(self.sent[-1])


class FakeTransport:
    def __init__(self, takes: int = 0) -> None:
        self.dataBuffer, self.offset, self._tempDataLen = b"", 0, 0
        self.connected, self.disconnecting, self.disconnected, self._writeDisconnected = True, False, False, False
        self.TLS = False
        self.socket = FakeSocket(takes)
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self._tempDataLen += len(data)

    def flush(self, size: int) -> None:
        self._tempDataLen -= size

    def fileno(self) -> int:
        raise AttributeError  # no socket: nothing in a kernel queue


class FakeProtocol:
    STATE_OPEN = 3

    def __init__(self, takes: int = 0) -> None:
        self.state = 3
        self.send_queue: list = []
        self.transport = FakeTransport(takes)


def test_frames_go_to_the_socket_at_once_and_only_the_rest_to_twisted():
    """With nothing waiting in Twisted's buffer a write is sent at once; what the socket does not
    take, and everything while something waits, goes to Twisted's buffer, in order."""
    protocol = FakeProtocol(takes=3)
    line = Wire(protocol)
    assert line.write(b"abcdef", 1)
    assert protocol.transport.socket.sent == [b"abc"]
    assert protocol.transport.written == [b"def"]
    assert line.write(b"gh", 1)  # "def" still waits: behind it
    assert protocol.transport.socket.sent == [b"abc"]
    assert protocol.transport.written == [b"def", b"gh"]
    protocol.transport.flush(5)
    assert line.write(b"ij", 1)
    assert protocol.transport.socket.sent == [b"abc", b"ij"]
    assert line.lag() == (0.0, 0)
    protocol.transport.TLS = True  # never around a TLS layer
    line.write(b"kl", 1)
    assert protocol.transport.written[-1] == b"kl"
    queued: list[bytes] = []
    protocol.send_queue = [(b"autobahn's own", False)]  # autobahn queueing: behind its writes
    protocol.sendData = queued.append
    line.write(b"mn", 1)
    assert queued == [b"mn"]


def test_wire_of_knows_daphne_and_nothing_else():
    class NotDaphne:
        async def handle_reply(self, protocol, message): ...

    assert Wire.of(lambda message: None) is None
    assert Wire.of(functools.partial(NotDaphne().handle_reply, FakeProtocol())) is None
    server = Server(None, endpoints=["tcp:port=0:interface=127.0.0.1"])  # Daphne's constructor: nothing listens yet
    assert Wire.of(functools.partial(server.handle_reply, FakeProtocol())) is None  # not Daphne's protocol


def test_the_lag_is_the_age_of_the_oldest_frame_the_client_has_not_taken(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(wire.time, "monotonic", lambda: clock[0])
    protocol = FakeProtocol()
    line = Wire(protocol)
    assert line.lag() == (0.0, 0)
    assert line.write(b"x" * 10, 2)
    clock[0] += 0.5
    assert line.write(b"y" * 10, 2)
    clock[0] += 0.5
    assert line.lag() == (1.0, 4)
    protocol.transport.flush(10)  # the first posting's frames went out
    assert line.lag() == (0.5, 2)
    protocol.transport.flush(10)
    assert line.lag() == (0.0, 0)
    # Writes within MARK_SECONDS share a mark (dated by the first).
    line.write(b"a", 1)
    clock[0] += wire.MARK_SECONDS / 2
    line.write(b"b", 1)
    assert len(line.marks) == 1
    clock[0] += 1
    assert line.lag() == (pytest.approx(1 + wire.MARK_SECONDS / 2), 2)
    protocol.state = 4  # closing: nothing more is written
    assert not line.write(b"c", 1)
    assert protocol.transport.written[-1] == b"b"


# --- the outbox (servers other than Daphne) is held to the same time bound -----------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_connection_whose_frames_wait_too_long_is_closed_even_without_new_events(master, assets, monkeypatch):
    """Its sender is stuck on one posting's frames: after STREAM_MAX_LAG_SECONDS (while well within
    STREAM_MAX_PENDING_FRAMES) the watcher closes it (4006); a connection that keeps up stays."""
    gate = asyncio.Event()
    stuck: list[UserDataConsumer] = []
    send_frame = UserDataConsumer._send_frame

    async def maybe_stuck(self, frame):
        if self in stuck:
            await gate.wait()
        await send_frame(self, frame)

    monkeypatch.setattr(UserDataConsumer, "_send_frame", maybe_stuck)
    key = await sync_to_async(services.listen_key_start)(account=master)
    with override_settings(
        STREAM_MAX_LAG_SECONDS=0.5, STREAM_MAX_PENDING_FRAMES=2000, STREAM_REVOCATION_CHECK_SECONDS=0.1
    ):
        slow = communicator(key)
        assert (await slow.connect())[0]
        stuck.extend(watcher._watchers[asyncio.get_running_loop()].consumers)
        fine = communicator(key)
        assert (await fine.connect())[0]
        started = time.monotonic()
        await sync_to_async(deposit)(master, "1")
        assert (await fine.receive_json_from(timeout=5))["e"] == "balanceUpdate"
        assert (await fine.receive_json_from(timeout=5))["e"] == "outboundAccountPosition"
        assert await slow.receive_output(timeout=5) == TOO_SLOW
        assert 0.5 <= time.monotonic() - started < 2.0
        assert await fine.receive_nothing(0.3)
        gate.set()
        await fine.disconnect()
        await slow.disconnect()
