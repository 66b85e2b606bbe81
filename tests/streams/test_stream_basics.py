import pytest
from asgiref.sync import sync_to_async

from streams import services
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import deposit
from tests.support.streams import communicator


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_events_after_a_deposit(master, master_key, assets):
    key = await sync_to_async(services.listen_key_start)(account=master)
    ws = communicator(key)
    connected, _ = await ws.connect()
    assert connected
    await sync_to_async(deposit)(master, "1.5")
    update = await ws.receive_json_from(timeout=3)
    position = await ws.receive_json_from(timeout=3)
    assert update["e"] == "balanceUpdate"
    assert update["a"] == "BTC"
    assert update["d"] == "1.50000000"
    assert update["BS"] == "CHAIN_DEPOSIT"
    assert isinstance(update["E"], int)
    assert isinstance(update["T"], int)
    assert position == {
        "e": "outboundAccountPosition",
        "E": position["E"],
        "u": update["T"],
        "B": [{"a": "BTC", "f": "1.50000000", "l": "0.00000000"}],
    }
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_unknown_key_is_refused():
    ws = communicator("nope")
    connected, _ = await ws.connect()
    assert not connected
    await ws.disconnect()  # end the refused consumer, so no task outlives the test's loop


@pytest.mark.django_db
def test_listen_key_endpoints(master, master_key):
    api_key, secret = master_key
    client = SignedClient(api_key.key, secret)
    first = client.post("/openapi/v1/userDataStream", signed=False).json()["listenKey"]
    again = client.post("/openapi/v1/userDataStream", signed=False).json()["listenKey"]
    assert first == again
    assert client.put("/openapi/v1/userDataStream", {"listenKey": first}, signed=False).json() == {}
    assert client.delete("/openapi/v1/userDataStream", {"listenKey": first}, signed=False).json() == {}
    assert_error(client.put("/openapi/v1/userDataStream", {"listenKey": first}, signed=False), -1125, 400)
