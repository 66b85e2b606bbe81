"""Security review, issue 12: the listenKey endpoints and the websocket when the listenKey store's
Redis is unreachable. POST answers -1126 (503), PUT and DELETE -1001 (503), a connection is refused
(1011); never a 500."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import User
from streams.models import ListenKey
from streams.store import _store_for
from tests.support.assertions import assert_error
from tests.support.streams import communicator

PATH = "/openapi/v1/userDataStream"
CLOSED_PORT = "redis://127.0.0.1:1/0"


@pytest.fixture(autouse=True)
def _keyring_clients_keep_the_real_url():
    """The keyring's process-wide Redis clients (invalidation messages and the revocation log) are
    made on first use from settings.REDIS_URL: made first during a test below, they would point at
    the closed port for the rest of the process (a later module's keyring invalidations then failed
    to reach the log). Made here, before any test points REDIS_URL away."""
    from accounts.keyring import _log_client, _redis

    _redis()
    _log_client()


@pytest.fixture
def redis_down(settings):
    """The listenKey store's Redis (settings.REDIS_URL) is unreachable; the rate limits' storage and
    the channel layer are not."""
    settings.REDIS_URL = CLOSED_PORT
    _store_for.cache_clear()
    yield
    _store_for.cache_clear()


@pytest.fixture
def live_key(signed_client) -> str:
    response = signed_client.post(PATH, signed=False)
    assert response.status_code == 200
    return response.json()["listenKey"]


@pytest.mark.django_db
def test_post_is_1126_when_the_store_is_down(master, signed_client, redis_down):
    assert_error(signed_client.post(PATH, signed=False), -1126, 503)
    assert not ListenKey.objects.filter(account=master, closed_at__isnull=True).exists()


@pytest.mark.django_db
def test_put_and_delete_are_1001_when_the_store_is_down(live_key, signed_client, settings):
    settings.REDIS_URL = CLOSED_PORT
    _store_for.cache_clear()
    try:
        assert_error(signed_client.put(PATH, {"listenKey": live_key}, signed=False), -1001, 503)
        assert_error(signed_client.delete(PATH, {"listenKey": live_key}, signed=False), -1001, 503)
    finally:
        _store_for.cache_clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_connection_is_refused_not_crashed_when_the_store_is_down(redis_down):
    ws = communicator("k" * 60)
    connected, code = await ws.connect()
    assert connected is False
    assert code == 1011
    await ws.disconnect()


@pytest.mark.django_db
def test_the_admin_lists_keys_when_the_store_is_down(live_key, settings):
    root = User.objects.create_superuser(email="root-outage@staff.example", password="pw-for-tests")
    admin_client = Client()
    admin_client.force_login(root)
    settings.REDIS_URL = CLOSED_PORT
    _store_for.cache_clear()
    try:
        response = admin_client.get(reverse("admin:streams_listenkey_changelist"))
    finally:
        _store_for.cache_clear()
    assert response.status_code == 200
    assert live_key[:12] in response.content.decode()
