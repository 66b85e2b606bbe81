"""Security review, issue 12, M4: a listenKey does not outlive the API key that was handed it, nor its
account. Disabling or deleting that key, or deactivating or freezing the account, closes the
listenKey and its open connections at once (streams/apps.py -> services.listen_keys_revoke_*); a
connection on a key whose account or API key may no longer stream is refused even if the key is
still in the store (streams/selectors.listen_key_owners)."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from accounts import services as account_services
from accounts.models import ApiKey, ApiKeyStatus, User
from exchange.api.errors import ApiKeyNotEnabled
from streams import services
from streams.models import ListenKey, ListenKeyHolder
from streams.store import store
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import deposit
from tests.support.streams import communicator
from tests.support.waiting import DEADLINE_SECONDS, Sent

PATH = "/openapi/v1/userDataStream"
KEY_DEAD = {"type": "websocket.close", "code": 4001}
ERR_LISTEN_KEY = -1125


@pytest.fixture
def other_account(make_user):
    return make_user()


def start(client: SignedClient) -> str:
    response = client.post(PATH, signed=False)
    assert response.status_code == 200, response.content
    return response.json()["listenKey"]


async def open_ws(key: str):
    """A connection on `key`; `ws.sent` records when the server sent each message."""
    sent = Sent()
    ws = communicator(key, sent=sent)
    ws.sent = sent
    connected, code = await ws.connect()
    assert connected, code
    return ws


async def assert_refused(key: str) -> None:
    ws = communicator(key)
    connected, code = await ws.connect()
    assert connected is False
    assert code == 4001
    await ws.disconnect()


async def revoked(revoke, api_key: ApiKey) -> float:
    """Runs `revoke(api_key)`; the monotonic time it returned (the revocation committed)."""

    def run() -> float:
        revoke(api_key)
        return time.monotonic()

    return await sync_to_async(run)()


async def assert_closed_within_a_second(ws, revoked_at: float) -> None:
    """The server sent the close within a second of the revocation: measured when it sent it,
    however long the test then takes to look."""
    closed_at = await ws.sent.first(KEY_DEAD)
    assert closed_at - revoked_at < 1, closed_at - revoked_at
    assert await ws.receive_output(timeout=DEADLINE_SECONDS) == KEY_DEAD
    await ws.disconnect()


async def receive_deposit(ws, user, amount: str) -> None:
    await sync_to_async(deposit)(user, amount)
    assert (await ws.receive_json_from(timeout=3))["e"] == "balanceUpdate"
    assert (await ws.receive_json_from(timeout=3))["e"] == "outboundAccountPosition"


def disable(api_key: ApiKey) -> None:
    account_services.api_key_set_status(api_key=api_key, enabled=False)


def delete(api_key: ApiKey) -> None:
    ApiKey.objects.get(pk=api_key.pk).delete()


def freeze(api_key: ApiKey) -> None:
    user = User.objects.get(pk=api_key.user_id)
    user.is_frozen = True
    user.save()


def delete_without_signals(api_key: ApiKey) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM accounts_apikey WHERE id = %s", [api_key.pk])


def deactivate(api_key: ApiKey) -> None:
    user = User.objects.get(pk=api_key.user_id)
    user.is_active = False
    user.save()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("revoke", [disable, delete, freeze, deactivate], ids=lambda f: f.__name__)
async def test_revocation_closes_the_open_stream_at_once_and_refuses_new_ones(
    revoke, master, master_key, signed_client, assets
):
    api_key, _ = master_key
    key = await sync_to_async(start)(signed_client)
    ws = await open_ws(key)
    other = await open_ws(key)  # every connection on the key closes
    await receive_deposit(ws, master, "1")
    assert [(await other.receive_json_from(timeout=3))["e"] for _ in range(2)] == [
        "balanceUpdate",
        "outboundAccountPosition",
    ]
    revoked_at = await revoked(revoke, api_key)
    await assert_closed_within_a_second(ws, revoked_at)
    await assert_closed_within_a_second(other, revoked_at)
    await assert_refused(key)
    assert await sync_to_async(store().owner)(key) is None
    assert (await ListenKey.objects.aget(key=key)).closed_at is not None
    # The keepalive is refused too: the key is gone, or its API key / account is.
    response = await sync_to_async(signed_client.put)(PATH, {"listenKey": key}, signed=False)
    assert response.json()["code"] in (-2015, -2018, ERR_LISTEN_KEY), response.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_disabled_key_keeps_its_stream_closed(master, master_key, signed_client):
    """-2015 for the keepalive (as before), and no way back in through the websocket."""
    api_key, _ = master_key
    key = await sync_to_async(start)(signed_client)
    await sync_to_async(disable)(api_key)
    assert_error(await sync_to_async(signed_client.put)(PATH, {"listenKey": key}, signed=False), -2015, 401)
    assert_error(await sync_to_async(signed_client.post)(PATH, signed=False), -2015, 401)
    await assert_refused(key)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_only_the_listen_keys_the_disabled_key_was_handed_close(master, master_key, signed_client, make_key):
    """The account's other, still-enabled key: a stream it started lives on when a key that never
    had it is disabled. The account has one live listenKey that POST hands to each of its keys; once
    the other key was handed it too, disabling that key closes it, and the enabled key starts anew."""
    other_key, other_secret = await sync_to_async(make_key)(master, name="other")
    other_client = SignedClient(other_key.key, other_secret)
    key = await sync_to_async(start)(signed_client)
    ws = await open_ws(key)

    await sync_to_async(disable)(other_key)  # never handed this listenKey
    assert await ws.receive_nothing(0.5)
    assert await sync_to_async(store().owner)(key) == master.pk
    await sync_to_async(account_services.api_key_set_status)(api_key=other_key, enabled=True)

    assert await sync_to_async(start)(other_client) == key  # the account's live key, handed to it too
    holders = ListenKeyHolder.objects.filter(listen_key_id=key).values_list("api_key", flat=True)
    assert {holder async for holder in holders} == {master_key[0].key, other_key.key}
    await assert_closed_within_a_second(ws, await revoked(disable, other_key))
    await assert_refused(key)

    fresh = await sync_to_async(start)(signed_client)
    assert fresh != key
    assert await sync_to_async(store().owner)(fresh) == master.pk
    await (await open_ws(fresh)).disconnect()  # the enabled key streams again


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_subscribed_key_of_a_frozen_account_is_dropped(make_user, make_key, assets):
    """A further key of another account on a connection: freezing that account drops it (and its
    events) from the connection, which goes on with its own key."""
    alice, bob = await sync_to_async(make_user)(), await sync_to_async(make_user)()
    alice_key = await sync_to_async(services.listen_key_start)(account=alice)
    bob_key = await sync_to_async(services.listen_key_start)(account=bob)
    ws = await open_ws(alice_key)
    await ws.send_json_to({"method": "SUBSCRIBE", "params": [bob_key], "id": 1})
    assert await ws.receive_json_from(timeout=3) == {"result": None, "id": 1}
    bob.is_frozen = True
    await bob.asave()
    await sync_to_async(deposit)(bob, "2")
    assert await ws.receive_nothing(0.5)
    await receive_deposit(ws, alice, "1")
    await ws.send_json_to({"method": "SUBSCRIBE", "params": [bob_key], "id": 2})
    answer = await ws.receive_json_from(timeout=3)
    assert answer["error"]["code"] == ERR_LISTEN_KEY
    await ws.disconnect()


# --- defence in depth: the account and the API keys are checked at connect ----------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("change", [{"is_frozen": True}, {"is_active": False}], ids=["frozen", "inactive"])
async def test_connect_checks_the_account_even_if_the_key_is_still_stored(master, other_account, change):
    key = await sync_to_async(services.listen_key_start)(account=master)
    await User.objects.filter(pk=master.pk).aupdate(**change)  # no signal: as if the revocation was lost
    assert await sync_to_async(store().owner)(key) == master.pk
    await assert_refused(key)
    # Nor can another connection add it.
    other = await open_ws(await sync_to_async(services.listen_key_start)(account=other_account))
    await other.send_json_to({"method": "SUBSCRIBE", "params": [key], "id": 7})
    assert (await other.receive_json_from(timeout=3))["error"]["code"] == ERR_LISTEN_KEY
    await other.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["disabled", "deleted", "record closed"])
async def test_connect_checks_the_api_keys_and_record_even_if_the_key_is_still_stored(master, master_key, how):
    api_key, _ = master_key
    key = await sync_to_async(services.listen_key_start)(account=master, api_key=api_key.key)
    # Each change made without its signal: as if the revocation had been lost.
    if how == "disabled":
        await ApiKey.objects.filter(pk=api_key.pk).aupdate(status=ApiKeyStatus.NOT_ENABLE)
    elif how == "deleted":
        await sync_to_async(delete_without_signals)(api_key)
    else:
        await ListenKey.objects.filter(key=key).aupdate(closed_at=timezone.now())
    assert await sync_to_async(store().owner)(key) == master.pk
    await assert_refused(key)


@pytest.mark.django_db(transaction=True)
def test_start_refuses_a_key_disabled_while_it_ran(master, master_key):
    """The revocation after the disabling commit looked for holders before this start wrote its
    own: the start sees the change and leaves no live key behind (-2015)."""
    api_key, _ = master_key
    ApiKey.objects.filter(pk=api_key.pk).update(status=ApiKeyStatus.NOT_ENABLE)  # committed meanwhile
    with pytest.raises(ApiKeyNotEnabled):
        services.listen_key_start(account=master, api_key=api_key.key)
    assert store().active_key(master.pk) is None
    assert not ListenKey.objects.filter(account=master, closed_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_a_frozen_account_gets_no_listen_key(master):
    master.is_frozen = True
    with pytest.raises(ApiKeyNotEnabled) as refused:
        services.listen_key_start(account=master)
    assert refused.value.code == -2015
    assert not ListenKey.objects.filter(account=master).exists()
