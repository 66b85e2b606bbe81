"""listenKey rules over REST (USER_STREAM: API key only, no signature), the ListenKey records, the
admin close action, and what the websocket does with a key: refused when unknown, closed on DELETE,
on expiry and at the maximum connection age."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from accounts.models import User
from streams import services, watcher
from streams.models import ListenKey
from streams.store import store
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.streams import communicator
from tests.support.waiting import DEADLINE_SECONDS, CallCounter, Sent, until, wait_until

PATH = "/openapi/v1/userDataStream"
KEY_DEAD = {"type": "websocket.close", "code": 4001}
MAX_AGE = {"type": "websocket.close", "code": 4002}


@pytest.fixture
def client_for(make_key):
    def make(user, **kw) -> SignedClient:
        api_key, secret = make_key(user, **kw)
        return SignedClient(api_key.key, secret)

    return make


def start(client: SignedClient) -> str:
    response = client.post(PATH, signed=False)
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"listenKey"}
    assert isinstance(body["listenKey"], str)
    return body["listenKey"]


def keepalive(client: SignedClient, key: str):
    return client.put(PATH, {"listenKey": key}, signed=False)


def close(client: SignedClient, key: str):
    return client.delete(PATH, {"listenKey": key}, signed=False)


# --- REST ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_post_returns_a_key_bound_to_the_account(master, signed_client):
    key = start(signed_client)
    assert len(key) == 60
    assert key.isalnum()
    assert store().owner(key) == master.pk
    ttl = store().ttl(key)
    assert 3595 < ttl <= 3600
    record = ListenKey.objects.get(key=key)
    assert record.account_id == master.pk
    assert record.closed_at is None
    expected_expiry = timezone.now() + timedelta(seconds=3600)
    assert abs((record.expires_at - expected_expiry).total_seconds()) < 5


@pytest.mark.django_db
def test_second_post_returns_the_same_key_and_extends_it(master, signed_client):
    key = start(signed_client)
    wait_until(lambda: store().ttl(key) < 3599.6, what="the key's TTL to run down")
    before = store().ttl(key)
    asked = time.monotonic()
    assert start(signed_client) == key
    after = store().ttl(key)
    assert after > before
    assert after >= 3600 - (time.monotonic() - asked) - 0.01  # the whole hour again from the POST
    assert ListenKey.objects.filter(account=master).count() == 1


@pytest.mark.django_db
def test_put_extends_the_key(master, signed_client):
    key = start(signed_client)
    record_before = ListenKey.objects.get(key=key).expires_at
    wait_until(lambda: store().ttl(key) < 3599.6, what="the key's TTL to run down")
    before = store().ttl(key)
    asked = time.monotonic()
    response = keepalive(signed_client, key)
    assert response.status_code == 200
    assert response.json() == {}
    after = store().ttl(key)
    assert after > before
    assert after >= 3600 - (time.monotonic() - asked) - 0.01  # the whole hour again from the PUT
    assert ListenKey.objects.get(key=key).expires_at > record_before


@pytest.mark.django_db
def test_delete_closes_the_key(master, signed_client):
    key = start(signed_client)
    response = close(signed_client, key)
    assert response.status_code == 200
    assert response.json() == {}
    assert store().owner(key) is None
    assert store().ttl(key) is None
    record = ListenKey.objects.get(key=key)
    assert record.closed_at is not None
    assert abs((timezone.now() - record.closed_at).total_seconds()) < 5
    # A closed key is dead for every use.
    assert_error(keepalive(signed_client, key), -1125, 400)
    assert_error(close(signed_client, key), -1125, 400)
    # The next POST starts a new key.
    fresh = start(signed_client)
    assert fresh != key
    assert store().owner(fresh) == master.pk
    assert ListenKey.objects.filter(account=master).count() == 2
    assert ListenKey.objects.get(key=fresh).closed_at is None


@pytest.mark.django_db
def test_unknown_key_is_1125(signed_client):
    assert_error(keepalive(signed_client, "x" * 60), -1125, 400)
    assert_error(close(signed_client, "x" * 60), -1125, 400)


@pytest.mark.django_db
def test_expired_key_is_1125(master, signed_client):
    with override_settings(LISTEN_KEY_TTL_SECONDS=1):
        key = start(signed_client)
        assert store().ttl(key) <= 1
        wait_until(lambda: store().owner(key) is None, what="the key to expire")
        assert_error(keepalive(signed_client, key), -1125, 400)
        assert_error(close(signed_client, key), -1125, 400)
        # An expired key is not reused by POST.
        fresh = start(signed_client)
    assert fresh != key
    assert store().owner(fresh) == master.pk


@pytest.mark.django_db
def test_another_accounts_key_is_1125(signed_client, make_user, client_for):
    other = make_user()
    other_client = client_for(other)
    other_key = start(other_client)
    assert_error(keepalive(signed_client, other_key), -1125, 400)
    assert_error(close(signed_client, other_key), -1125, 400)
    # Untouched: still the other account's, still open.
    assert store().owner(other_key) == other.pk
    assert ListenKey.objects.get(key=other_key).closed_at is None
    assert keepalive(other_client, other_key).json() == {}


@pytest.mark.django_db
def test_missing_listen_key_is_1105(signed_client):
    start(signed_client)
    body = assert_error(signed_client.put(PATH, signed=False), -1105, 400)
    assert "listenKey" in body["msg"]
    body = assert_error(signed_client.delete(PATH, signed=False), -1105, 400)
    assert "listenKey" in body["msg"]


@pytest.mark.django_db
def test_no_api_key_is_1002(master, signed_client):
    anonymous = SignedClient(None, "no-secret")  # sends no X-SERVICE-APIKEY header
    assert_error(anonymous.post(PATH, signed=False), -1002, 401)
    key = start(signed_client)
    assert_error(keepalive(anonymous, key), -1002, 401)
    assert_error(close(anonymous, key), -1002, 401)
    assert store().owner(key) == master.pk


@pytest.mark.django_db
def test_no_signature_is_needed_but_a_signed_call_works_too(master, signed_client):
    unsigned = start(signed_client)
    signed = signed_client.post(PATH).json()["listenKey"]
    assert signed == unsigned


@pytest.mark.django_db
def test_read_only_key_may_manage_a_stream(make_user, client_for):
    user = make_user()
    client = client_for(user, types=["Read only"])
    key = start(client)
    assert store().owner(key) == user.pk
    assert keepalive(client, key).json() == {}
    assert close(client, key).json() == {}
    assert store().owner(key) is None


@pytest.mark.django_db
def test_hourly_creation_limit_is_1026(master, signed_client):
    with override_settings(LISTEN_KEY_CREATE_LIMIT_PER_HOUR=2):
        first = start(signed_client)
        # Reusing the live key is not a creation.
        assert start(signed_client) == first
        assert start(signed_client) == first
        assert close(signed_client, first).json() == {}
        second = start(signed_client)
        assert second != first
        assert close(signed_client, second).json() == {}
        body = assert_error(signed_client.post(PATH, signed=False), -1026, 429)
        assert "2" in body["msg"]
        # Refused again, and nothing was created by the refusals.
        assert_error(signed_client.post(PATH, signed=False), -1026, 429)
    assert list(ListenKey.objects.filter(account=master).order_by("created_at").values_list("key", flat=True)) == [
        first,
        second,
    ]
    assert all(record.closed_at is not None for record in ListenKey.objects.filter(account=master))


@pytest.mark.django_db
def test_creation_limit_is_per_account(master, signed_client, make_user, client_for):
    other_client = client_for(make_user())
    with override_settings(LISTEN_KEY_CREATE_LIMIT_PER_HOUR=1):
        key = start(signed_client)
        close(signed_client, key)
        assert_error(signed_client.post(PATH, signed=False), -1026, 429)
        start(other_client)


@pytest.fixture
def staff_client(db) -> Client:
    root = User.objects.create_superuser(email="root-streams@staff.example", password="pw-for-tests")
    client = Client()
    client.force_login(root)
    return client


def admin_close(staff_client: Client, *records: ListenKey):
    url = reverse("admin:streams_listenkey_changelist")
    return staff_client.post(
        url, {"action": "close_keys", "_selected_action": [r.pk for r in records], "index": 0}, follow=True
    )


@pytest.mark.django_db
def test_admin_close_action_kills_the_key(master, signed_client, staff_client):
    key = start(signed_client)
    record = ListenKey.objects.get(key=key)
    listing = staff_client.get(reverse("admin:streams_listenkey_changelist"))
    assert listing.status_code == 200
    assert key[:12] in listing.content.decode()
    response = admin_close(staff_client, record)
    assert response.status_code == 200
    assert "Closed 1 listenKey(s)." in response.content.decode()
    assert store().owner(key) is None
    record.refresh_from_db()
    assert record.closed_at is not None
    assert_error(keepalive(signed_client, key), -1125, 400)
    assert start(signed_client) != key


# --- the websocket -------------------------------------------------------------------------------


async def _open(key: str, sent: Sent | None = None):
    ws = communicator(key, sent=sent)
    connected, _ = await ws.connect()
    assert connected
    return ws


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_unknown_key_is_refused():
    ws = communicator("z" * 60)
    connected, code = await ws.connect()
    assert connected is False
    assert code == 4001
    await ws.disconnect()  # end the refused consumer, so no task outlives the test's loop


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_closed_key_is_refused(master, signed_client):
    key = await sync_to_async(start)(signed_client)
    await sync_to_async(close)(signed_client, key)
    ws = communicator(key)
    connected, code = await ws.connect()
    assert connected is False
    assert code == 4001
    await ws.disconnect()  # end the refused consumer, so no task outlives the test's loop


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_delete_closes_an_open_connection(master, signed_client):
    key = await sync_to_async(start)(signed_client)
    ws = await _open(key)
    assert await ws.receive_nothing(0.2)
    response = await sync_to_async(close)(signed_client, key)
    assert response.json() == {}
    assert await ws.receive_output(timeout=3) == KEY_DEAD
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_admin_close_closes_an_open_connection(master, signed_client, staff_client):
    key = await sync_to_async(start)(signed_client)
    ws = await _open(key)
    record = await ListenKey.objects.aget(key=key)
    response = await sync_to_async(admin_close)(staff_client, record)
    assert response.status_code == 200
    assert await ws.receive_output(timeout=3) == KEY_DEAD
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_expiry_closes_the_connection_after_the_ttl(master, signed_client):
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2, LISTEN_KEY_TTL_SECONDS=1):
        asked = time.monotonic()
        key = await sync_to_async(start)(signed_client)
        created = time.monotonic()
        sent = Sent()
        ws = await _open(key, sent)
        closed = await sent.first(KEY_DEAD)  # when the server sent it, however late the test looks
        assert closed - asked >= 0.99, closed - asked  # not before the TTL...
        assert closed - created <= 1.8, closed - created  # ... and at the next checks after it
        assert await ws.receive_output(timeout=DEADLINE_SECONDS) == KEY_DEAD
        await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_expiry_sends_one_close_only(master, signed_client, monkeypatch):
    """Once closed for a dead key, the consumer does not go on sending close frames while the
    client's close handshake is under way."""
    checks = CallCounter(watcher._look_up)
    monkeypatch.setattr(watcher, "_look_up", checks)
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.1, LISTEN_KEY_TTL_SECONDS=1):
        key = await sync_to_async(start)(signed_client)
        ws = await _open(key)
        assert await ws.receive_output(timeout=DEADLINE_SECONDS) == KEY_DEAD
        # Until the watcher checked 3 more times (a close frame each, were it wrong) or watches
        # nobody any more (the consumer let go of it: nothing left to send another close).
        loop, target = asyncio.get_running_loop(), len(checks.calls) + 3
        await until(
            lambda: len(checks.calls) >= target or not getattr(watcher._watchers.get(loop), "consumers", None),
            what="more checks, or none left to make",
        )
        extra = []
        while not ws.output_queue.empty():
            extra.append(ws.output_queue.get_nowait())
        assert extra == []
        await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_keepalive_keeps_the_connection_open(master, signed_client):
    with override_settings(STREAM_KEY_CHECK_SECONDS=0.2, LISTEN_KEY_TTL_SECONDS=1):
        key = await sync_to_async(start)(signed_client)
        sent = Sent()
        ws = await _open(key, sent)
        for _ in range(5):  # 2.5 s: well past the 1 s TTL
            await asyncio.sleep(0.5)
            last_asked = time.monotonic()
            assert (await sync_to_async(keepalive)(signed_client, key)).json() == {}
            assert ws.output_queue.empty()
        stopped = time.monotonic()
        closed = await sent.first(KEY_DEAD)
        assert closed - last_asked >= 0.99, closed - last_asked  # the last keepalive's full TTL...
        assert closed - stopped <= 1.6, closed - stopped  # ... and no longer
        assert await ws.receive_output(timeout=DEADLINE_SECONDS) == KEY_DEAD
        await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_max_connection_age_closes_the_connection(master):
    with override_settings(STREAM_MAX_CONNECTION_SECONDS=1):
        key = await sync_to_async(services.listen_key_start)(account=master)
        opening = time.monotonic()
        sent = Sent()
        ws = await _open(key, sent)
        opened = time.monotonic()
        closed = await sent.first(MAX_AGE)  # when the server sent it
        assert closed - opening >= 0.99, closed - opening
        assert closed - opened <= 1.8, closed - opened
        assert await ws.receive_output(timeout=DEADLINE_SECONDS) == MAX_AGE
        await ws.disconnect()
    # The key itself is still alive: only the connection aged out.
    assert await sync_to_async(store().owner)(key) == master.pk
