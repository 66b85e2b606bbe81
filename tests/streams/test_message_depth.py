"""A websocket message is JSON a client sends: it is measured before it is parsed
(exchange/api/jsontext.py; issue 34, finding 5). One nested deeper than the bound is answered as
not JSON (-1010) on a connection that stays open and keeps working; nothing is logged as an error."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async

from streams import services
from tests.support.streams import communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NOT_JSON = {"error": {"code": -1010, "msg": "Invalid request: not JSON."}, "id": None}


@pytest.mark.parametrize(
    "text",
    [
        "[" * 2600,  # what the parser cannot take: a RecursionError
        '{"method": "UNSUBSCRIBE", "params": ' + "[" * 16 + "]" * 16 + ', "id": 1}',  # one level too deep
    ],
)
async def test_a_deeply_nested_message_is_not_json_and_the_connection_lives_on(make_user, caplog, text):
    caplog.set_level(logging.INFO)
    user = await sync_to_async(make_user)()
    key = await sync_to_async(services.listen_key_start)(account=user)
    ws = communicator(key)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_to(text_data=text)
    assert await ws.receive_json_from(timeout=3) == NOT_JSON
    await ws.send_json_to({"method": "UNSUBSCRIBE", "params": [], "id": 2})
    assert await ws.receive_json_from(timeout=3) == {"result": None, "id": 2}
    await ws.disconnect()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]
