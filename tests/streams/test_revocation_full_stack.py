"""Security review, issue 12, across processes: two Daphne servers on one PostgreSQL and Redis (as in
production, several websocket processes behind a load balancer) and a third process that disables
an API key. Every server's connections on its listenKeys close at once; the caps per listenKey
count the connections of both servers.

Uses the servers of tests/streams/test_full_stack.py (tests/support/stack.py), on a database of its
own, `<FULLSTACK_DATABASE_NAME>_rev`, and the same Redis database, flushed before and after; fails
when PostgreSQL or Redis is down.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support.stack import (
    FULLSTACK_DB_NAME,
    FULLSTACK_REDIS_DB,
    daphne,
    daphne_env,
    load_demo,
    manage,
    private_services,
    requires_services,
)

pytestmark = [requires_services(FULLSTACK_REDIS_DB), pytest.mark.timeout(180)]

KEY_CAP = 2

# For `manage.py shell -c`, with the key's text.
DISABLE_KEY = """
from accounts import services
from accounts.models import ApiKey
services.api_key_set_status(api_key=ApiKey.objects.get(key={key!r}), enabled=False)
"""


@pytest.fixture(scope="module")
def two_servers():
    with private_services(f"{FULLSTACK_DB_NAME}_rev", FULLSTACK_REDIS_DB) as (database_url, redis_url):
        env = daphne_env(DATABASE_URL=database_url, REDIS_URL=redis_url, STREAM_MAX_CONNECTIONS_PER_KEY=str(KEY_CAP))
        world = load_demo(env)
        with daphne(env, world) as first, daphne(env, world) as second:
            yield first, second


def _open(url: str):
    return connect(url, open_timeout=10, proxy=None)


def test_the_cap_per_listen_key_counts_every_servers_connections(two_servers):
    first, second = two_servers
    key = first.start_key()
    with _open(first.ws_url(key)), _open(second.ws_url(key)):
        with pytest.raises(InvalidStatus) as refused, _open(first.ws_url(key)):
            pass
        assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus), _open(second.ws_url(key)):
            pass
    deadline = time.time() + 5  # the servers see the closes and give the places back
    while True:
        try:
            with _open(second.ws_url(key)):
                break
        except InvalidStatus:
            assert time.time() < deadline, "a closed connection still counts"
            time.sleep(0.1)


def test_disabling_the_api_key_in_another_process_closes_the_streams_of_every_server(two_servers):
    first, second = two_servers
    key = first.start_key()
    with contextlib.ExitStack() as stack:
        streams = [stack.enter_context(_open(server.ws_url(key))) for server in (first, second)]
        manage(first.env, "shell", "-c", DISABLE_KEY.format(key=first.world["master"]["api_key"]))
        for ws in streams:  # the revocation ran after the commit, before that process exited
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=1)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4001
    for server in (first, second):
        with pytest.raises(InvalidStatus), _open(server.ws_url(key)):
            pass
