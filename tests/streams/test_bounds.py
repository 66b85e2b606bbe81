"""Security review, issue 12: what one client may cost the websocket server. Connections per
listenKey and per client IP are capped across processes (counted in Redis, with leases that expire
with a crashed process); SUBSCRIBE looks its keys up in one round trip; client messages are
rate-limited per connection; oversized messages close the connection."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings

from streams import consumers, services, watcher
from streams.store import Lease, MemoryStore, store
from tests.support.streams import communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TOO_MANY_ON_KEY = 4003
TOO_MANY_FROM_IP = 4004
TOO_MANY_MESSAGES = 4005
MESSAGE_TOO_BIG = 1009


async def key_of(user) -> str:
    return await sync_to_async(services.listen_key_start)(account=user)


async def opened(key: str, **kw):
    ws = communicator(key, **kw)
    connected, code = await ws.connect()
    assert connected, code
    return ws


async def refused(key: str, **kw) -> int:
    ws = communicator(key, **kw)
    connected, code = await ws.connect()
    assert connected is False
    await ws.disconnect()
    return code


async def count(*, key: str | None = None, ip: str | None = None) -> int:
    return await sync_to_async(store().connection_count)(key=key, ip=ip)


# --- connections per listenKey and per IP -------------------------------------------------------------


async def test_connections_per_listen_key_are_capped(master):
    key = await key_of(master)
    with override_settings(STREAM_MAX_CONNECTIONS_PER_KEY=3):
        clients = [await opened(key) for _ in range(3)]
        assert await count(key=key) == 3
        assert await refused(key) == TOO_MANY_ON_KEY
        await clients.pop().disconnect()  # a closed connection frees its place at once
        assert await count(key=key) == 2
        clients.append(await opened(key))
        assert await refused(key) == TOO_MANY_ON_KEY
        for ws in clients:
            await ws.disconnect()
    assert await count(key=key) == 0


async def test_default_cap_per_listen_key(master):
    key = await key_of(master)
    clients = [await opened(key) for _ in range(consumers.MAX_CONNECTIONS_PER_KEY)]
    assert await refused(key) == TOO_MANY_ON_KEY
    for ws in clients:
        await ws.disconnect()


async def test_connections_per_ip_are_capped(make_user):
    keys = [await key_of(await sync_to_async(make_user)()) for _ in range(3)]
    with override_settings(STREAM_MAX_CONNECTIONS_PER_IP=2):
        first = await opened(keys[0], client="203.0.113.7")
        second = await opened(keys[1], client="203.0.113.7")
        assert await count(ip="203.0.113.7") == 2
        assert await refused(keys[2], client="203.0.113.7") == TOO_MANY_FROM_IP
        other_ip = await opened(keys[2], client="198.51.100.1")
        await first.disconnect()
        third = await opened(keys[2], client="203.0.113.7")
        for ws in (second, other_ip, third):
            await ws.disconnect()
    assert await count(ip="203.0.113.7") == 0


async def test_the_ip_is_the_gateways_forwarded_for_rule(make_user):
    """X-Forwarded-For is believed only from TRUSTED_PROXIES, as in the REST gateway."""
    keys = [await key_of(await sync_to_async(make_user)()) for _ in range(3)]
    forwarded = [(b"x-forwarded-for", b"203.0.113.9")]
    with override_settings(STREAM_MAX_CONNECTIONS_PER_IP=1, TRUSTED_PROXIES=["10.0.0.0/8"]):
        via_proxy = await opened(keys[0], client="10.0.0.5", headers=forwarded)
        assert await count(ip="203.0.113.9") == 1
        # Through another proxy, the same client is the same client ...
        assert await refused(keys[1], client="10.0.0.6", headers=forwarded) == TOO_MANY_FROM_IP
        # ... and a peer that is no proxy cannot pass for someone else (nor escape its own count).
        forger = await opened(keys[1], client="192.0.2.1", headers=forwarded)
        assert await count(ip="192.0.2.1") == 1
        assert await refused(keys[2], client="192.0.2.1", headers=[(b"x-forwarded-for", b"192.0.2.2")]) == (
            TOO_MANY_FROM_IP
        )
        await via_proxy.disconnect()
        await forger.disconnect()


async def test_a_crashed_processs_connections_stop_counting(master):
    """A lease nobody renews (its process died) expires; live connections' leases are renewed by
    their process's watcher."""
    key = await key_of(master)
    crashed = Lease(connection="crashed-process!1", key=key, ip=None)
    assert await sync_to_async(store().connection_open)(crashed, key_cap=1, ip_cap=1, seconds=0.5) is None
    with override_settings(STREAM_MAX_CONNECTIONS_PER_KEY=1):
        assert await refused(key) == TOO_MANY_ON_KEY
        await asyncio.sleep(0.6)
        ws = await opened(key)
        await ws.disconnect()


async def test_the_watcher_renews_the_leases_of_live_connections(master, monkeypatch):
    monkeypatch.setattr(consumers, "connection_lease_seconds", lambda: 0.6)
    monkeypatch.setattr(watcher, "connection_lease_seconds", lambda: 0.6)
    key = await key_of(master)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.1, STREAM_MAX_CONNECTIONS_PER_KEY=1):
        ws = await opened(key)
        await asyncio.sleep(1.5)  # well past the lease: renewed meanwhile
        assert await count(key=key) == 1
        assert await refused(key) == TOO_MANY_ON_KEY
        await ws.disconnect()
    assert await count(key=key) == 0


async def test_memory_store_counts_like_redis():
    """The embedded default's counts (one process: no leases)."""
    memory = MemoryStore()
    a, b, c = (Lease(connection=f"c{n}", key="k", ip="192.0.2.1") for n in range(3))
    assert memory.connection_open(a, key_cap=2, ip_cap=5, seconds=60) is None
    assert memory.connection_open(b, key_cap=2, ip_cap=5, seconds=60) is None
    assert memory.connection_open(c, key_cap=2, ip_cap=5, seconds=60) == "listenKey"
    assert memory.connection_open(Lease("d", "other", "192.0.2.1"), key_cap=2, ip_cap=2, seconds=60) == "ip"
    assert memory.connection_count(key="k") == 2
    memory.connection_close(a)
    assert memory.connection_open(c, key_cap=2, ip_cap=5, seconds=60) is None
    assert memory.connection_count(ip="192.0.2.1") == 2
    assert memory.connection_count(key="other") == 0


# --- SUBSCRIBE in one round trip ------------------------------------------------------------------------


async def test_subscribe_looks_all_its_keys_up_at_once(master, monkeypatch):
    ws = await opened(await key_of(master))
    kind = store()
    calls = []
    owner, owners = kind.owner, kind.owners
    monkeypatch.setattr(kind, "owner", lambda key: calls.append(("owner", 1)) or owner(key))
    monkeypatch.setattr(kind, "owners", lambda keys: calls.append(("owners", len(keys))) or owners(keys))
    unknown = [f"{n:060d}" for n in range(1023)]
    await ws.send_json_to({"method": "SUBSCRIBE", "params": unknown, "id": 1})
    answer = await ws.receive_json_from(timeout=3)
    assert answer["error"]["code"] == -1125
    assert calls == [("owners", 1023)]
    await ws.disconnect()


# --- messages: rate and size ----------------------------------------------------------------------------


async def test_client_messages_are_rate_limited(master):
    ws = await opened(await key_of(master))
    for n in range(5):
        await ws.send_json_to({"method": "UNSUBSCRIBE", "params": [], "id": n})
    await ws.send_json_to({"method": "UNSUBSCRIBE", "params": [], "id": 5})
    answers = [await ws.receive_json_from(timeout=3) for _ in range(6)]
    assert answers[:5] == [{"result": None, "id": n} for n in range(5)]
    assert answers[5]["error"]["code"] == -1003
    assert set(answers[5]["error"]) == {"code", "msg"}
    await asyncio.sleep(0.25)  # a token back
    await ws.send_json_to({"method": "UNSUBSCRIBE", "params": [], "id": 6})
    assert await ws.receive_json_from(timeout=3) == {"result": None, "id": 6}
    await ws.disconnect()


async def test_a_client_that_keeps_flooding_is_disconnected(master):
    ws = await opened(await key_of(master))
    for n in range(30):
        await ws.send_to(text_data=json.dumps({"method": "UNSUBSCRIBE", "params": [], "id": n}))
    outputs = []
    while True:
        output = await ws.receive_output(timeout=3)
        outputs.append(output)
        if output["type"] == "websocket.close":
            break
    assert output == {"type": "websocket.close", "code": TOO_MANY_MESSAGES}
    refusals = [json.loads(o["text"]) for o in outputs if o["type"] == "websocket.send"][5:]
    assert refusals
    assert all(answer["error"]["code"] == -1003 for answer in refusals)
    assert len(refusals) == consumers.REFUSALS_BEFORE_CLOSE
    assert await ws.receive_nothing(0.3)  # nothing more once closed
    await ws.disconnect()


async def test_an_oversized_message_closes_the_connection(master):
    ws = await opened(await key_of(master))
    # The largest request there is, a SUBSCRIBE of 1024 keys, is well within the bound.
    await ws.send_json_to({"method": "SUBSCRIBE", "params": [f"{n:064d}" for n in range(1024)], "id": 1})
    assert (await ws.receive_json_from(timeout=3))["error"]["code"] == -1015
    await ws.send_to(text_data="[" + " " * consumers.MAX_MESSAGE_CHARS + "]")
    assert await ws.receive_output(timeout=3) == {"type": "websocket.close", "code": MESSAGE_TOO_BIG}
    await ws.disconnect()


async def test_the_message_bound_is_a_setting(master):
    ws = await opened(await key_of(master))
    with override_settings(STREAM_MAX_MESSAGE_CHARS=100):
        await ws.send_to(text_data=json.dumps({"method": "UNSUBSCRIBE", "params": ["x" * 100], "id": 1}))
        assert await ws.receive_output(timeout=3) == {"type": "websocket.close", "code": MESSAGE_TOO_BIG}
    await ws.disconnect()
