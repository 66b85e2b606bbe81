"""Issue 34, finding 6: a deeply nested websocket message ended the connection (1011) without
`disconnect()`, so its place stayed counted in the per-listenKey and per-IP caps (until restart
embedded, a day on Redis): connection 9 was refused after 8 crashed ones. Now a message is bounded
before it is parsed (exchange/api/jsontext.py, at most 16 levels: -1010, the connection goes on), and every way a
connection ends, an exception in the consumer included, ends in the same cleanup
(streams/consumers.py `_cleanup`). In-process (the ASGI communicator), on the test run's store;
tests/streams/test_embedded_revocation.py repeats the nested message against a real Daphne.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from streams import consumers, services
from streams.store import store
from tests.support.streams import communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

CAP = 8
IP = "203.0.113.34"
NESTED = "[" * 50_000  # well under STREAM_MAX_MESSAGE_CHARS; json.loads raised RecursionError on it
BAD_REQUEST = -1010
SERVER_ERROR = 1011


async def _count(*, key: str | None = None, ip: str | None = None) -> int:
    return await sync_to_async(store().connection_count)(key=key, ip=ip)


async def _opened(key: str):
    ws = communicator(key, client=IP)
    connected, code = await ws.connect()
    assert connected, code
    return ws


@pytest.fixture
def capped():
    with override_settings(STREAM_MAX_CONNECTIONS_PER_KEY=CAP, STREAM_MAX_CONNECTIONS_PER_IP=CAP):
        yield


async def test_deeply_nested_messages_are_refused_and_leave_no_place_counted(master, capped):
    key = await sync_to_async(services.listen_key_start)(account=master)
    for n in range(CAP + 1):
        ws = await _opened(key)
        await ws.send_to(text_data=NESTED)
        answer = await ws.receive_json_from(timeout=5)
        assert answer["id"] is None
        assert answer["error"]["code"] == BAD_REQUEST
        assert answer["error"]["msg"] == "Invalid request: not JSON."
        # The connection goes on: a request after it is answered.
        await ws.send_json_to({"method": "UNSUBSCRIBE", "params": [], "id": n})
        assert await ws.receive_json_from(timeout=5) == {"result": None, "id": n}
        await ws.disconnect()
    assert await _count(key=key) == 0
    assert await _count(ip=IP) == 0
    # The cap is whole again: CAP connections on the same key from the same address.
    clients = [await _opened(key) for _ in range(CAP)]
    assert await _count(key=key) == CAP
    for ws in clients:
        await ws.disconnect()


async def test_an_exception_in_the_consumer_closes_1011_and_frees_the_place(master, capped, monkeypatch, caplog):
    """Any exception inside the consumer (here receive_json fails): logged, closed 1011, and its
    places given back although the client never closes (no websocket.disconnect comes)."""

    async def broken(self, content, **kwargs):
        raise RuntimeError("a bug in the consumer")

    monkeypatch.setattr(consumers.UserDataConsumer, "receive_json", broken)
    key = await sync_to_async(services.listen_key_start)(account=master)
    for _ in range(CAP + 1):
        ws = await _opened(key)
        await ws.send_json_to({"method": "UNSUBSCRIBE", "params": [], "id": 1})
        assert await ws.receive_output(timeout=5) == {"type": "websocket.close", "code": SERVER_ERROR}
        await ws.wait(timeout=5)  # the application returned (it did not raise)
        assert await _count(key=key) == 0
        assert await _count(ip=IP) == 0
    assert "A websocket connection failed" in caplog.text
    fresh = await _opened(key)
    await fresh.disconnect()
