"""Watching a revocation from outside, against real servers (tests/security/test_revocation_bound.py
on several PostgreSQL+Redis servers, tests/security/test_embedded_revocation.py on the embedded one):
a signed request polled until it is refused, a websocket held until the server closes it, and the
listenKey to hold it on."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import threading
import time
from urllib.parse import urlencode

import requests
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

POLL = 0.02  # seconds between two polls


def signed_get(session: requests.Session, server, key: str, secret: str) -> tuple[int, int | None]:
    """GET /openapi/v1/account signed with `key`: (HTTP status, the error code or None on 200)."""
    query = urlencode({"timestamp": int(time.time() * 1000)})
    signature = hmac.new(secret.encode(), query.encode(), hashlib.sha256).hexdigest()
    response = session.get(
        f"{server.http}/openapi/v1/account?{query}&signature={signature}", headers={"X-SERVICE-APIKEY": key}, timeout=5
    )
    return response.status_code, (None if response.status_code == 200 else response.json().get("code"))


class Poller(threading.Thread):
    """Polls one server with the key until it is refused: `refused_at` (wall clock) and the answer."""

    def __init__(self, server, key: str, secret: str):
        super().__init__(daemon=True)
        self.server, self.key, self.secret = server, key, secret
        self.accepted = threading.Event()  # at least one 200 (the server's cache holds the key)
        self.refused_at: float | None = None
        self.answer: tuple[int, int | None] | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            while not self.stop.is_set():
                status, code = signed_get(session, self.server, self.key, self.secret)
                if status != 200:
                    self.refused_at, self.answer = time.time(), (status, code)
                    return
                self.accepted.set()
                time.sleep(POLL)


class StreamWatcher(threading.Thread):
    """Holds one websocket until the server closes it: `closed_at` (wall clock) and the close code."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.ws = connect(url, open_timeout=10, proxy=None)
        self.closed_at: float | None = None
        self.code: int | None = None

    def run(self) -> None:
        with self.ws as ws, contextlib.suppress(TimeoutError):
            try:
                while True:
                    ws.recv(timeout=30)
            except ConnectionClosed as closed:
                self.closed_at = time.time()
                self.code = closed.rcvd.code if closed.rcvd is not None else None


def new_listen_key(server, key: str) -> str:
    """A listenKey of `key`'s account, from the server's REST endpoint."""
    response = requests.post(f"{server.http}/openapi/v1/userDataStream", headers={"X-SERVICE-APIKEY": key}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["listenKey"]
