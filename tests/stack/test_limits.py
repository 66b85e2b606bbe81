"""What a client may send, through the stack's front (issue 18, item 4): nginx, granian and Daphne
started with harness's own configuration (nginx_conf, programs, supervisord) on a private database.

- an oversized body (413), header (400), request line (414): each the JSON envelope -1010 from
  nginx, the backend never sees it; a body just under the bound passes;
- slow clients (headers or a body that never finish, many more than the REST threads): dropped by
  nginx after STACK_CLIENT_TIMEOUT (2 s here, 10 s by default), and other requests are answered
  meanwhile (nginx reads the whole request before granian gets it);
- a websocket frame over Daphne's --websocket-max-frame-size (128 KB) closes the connection with
  1009 before the application reads it (the application's own bound is lifted here to show it).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import requests
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from harness.layout import Layout
from harness.layout import stack_env as full_stack_env
from harness.run import prepare
from harness.supervisor import Supervisor
from tests.support.stack import (
    FULLSTACK_DB_NAME,
    FULLSTACK_REDIS_DB,
    free_port,
    load_demo,
    private_services,
    requires_services,
    stack_env,
)

pytestmark = [requires_services(FULLSTACK_REDIS_DB), pytest.mark.timeout(180)]

CLIENT_TIMEOUT = 2  # STACK_CLIENT_TIMEOUT for this stack (seconds)
REST_THREADS = 2
SLOW_CLIENTS = 40  # many times the REST threads


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stack")
    with private_services(f"{FULLSTACK_DB_NAME}_limits", FULLSTACK_REDIS_DB) as (database_url, redis_url):
        env = full_stack_env(
            stack_env(
                DATABASE_URL=database_url,
                REDIS_URL=redis_url,
                # Lifted so that only Daphne's frame bound can refuse the big frame below.
                STREAM_MAX_MESSAGE_CHARS=str(10 * 1024 * 1024),
            )
        )
        world = load_demo(env)
        layout = Layout(
            port=free_port(),
            rest_port=free_port(),
            ws_ports=[free_port()],
            rest_workers=1,
            rest_threads=REST_THREADS,
            celery_concurrency=1,
            run_dir=run_dir,
            beat=False,
            client_timeout=CLIENT_TIMEOUT,
        )
        wanted = {"rest", "ws", "nginx"}
        programs = [p for p in prepare(env, layout) if p.name in wanted]
        supervisor = Supervisor(programs, env, run_dir, log=run_dir / "stack.log")
        try:
            supervisor.start()
            yield layout, world, run_dir / "stack.log"
        finally:
            supervisor.stop()


def _raw(port: int, data: bytes, timeout: float = 10) -> tuple[int, dict, bytes]:
    """Send `data` on a new connection; (status, JSON body or {}, raw answer) of the first answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, (json.loads(body) if body.startswith(b"{") else {}), answer


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _request(path: str, headers: str = "", body_length: int | None = None, method: str = "GET") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}"
    if body_length is not None:
        head += f"Content-Length: {body_length}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    return (head + "\r\n").encode()


def test_an_oversized_body_header_or_request_line_gets_the_json_envelope_from_the_front(front):
    layout, _, _ = front
    # Body: announced over 16 KB on /openapi/ -> 413 before a byte of it is read.
    status, body, _ = _raw(layout.port, _request("/openapi/v1/ping", body_length=16 * 1024 + 1, method="POST"))
    assert (status, body["code"]) == (413, -1010), body
    # Just under: nginx passes it on, the gateway answers (POST is not allowed on ping: 405 -1010).
    small = _request("/openapi/v1/ping", body_length=16 * 1024, method="POST") + b"a" * (16 * 1024)
    status, body, _ = _raw(layout.port, small)
    assert (status, body["code"]) == (405, -1010), body
    # One header line over 8 KB -> 400.
    status, body, _ = _raw(layout.port, _request("/openapi/v1/ping", headers=f"X-Big: {'a' * 9000}\r\n"))
    assert (status, body["code"]) == (400, -1010), body
    # Headers over 32 KB in total (lines under 8 KB each) -> 400.
    many = "".join(f"X-H{i}: {'a' * 7000}\r\n" for i in range(6))
    status, body, _ = _raw(layout.port, _request("/openapi/v1/ping", headers=many))
    assert (status, body["code"]) == (400, -1010), body
    # Request line over 8 KB -> 414.
    status, body, _ = _raw(layout.port, _request("/openapi/v1/ping?x=" + "a" * 9000))
    assert (status, body["code"]) == (414, -1010), body
    # And the stack still answers.
    assert requests.get(f"http://127.0.0.1:{layout.port}/openapi/v1/ping", timeout=5).status_code == 200


def test_slow_clients_are_dropped_in_the_documented_time_and_hold_no_worker(front):
    layout, _, _ = front
    slow = []
    for i in range(SLOW_CLIENTS):
        sock = socket.create_connection(("127.0.0.1", layout.port), timeout=CLIENT_TIMEOUT + 10)
        if i % 2:  # a body announced and never sent
            sock.sendall(_request("/openapi/v1/ping", body_length=100, method="POST"))
        else:  # headers never finished
            sock.sendall(b"GET /openapi/v1/ping HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(sock)
    started = time.monotonic()
    # Meanwhile, with 20 times the REST threads held by slow clients, requests are answered at once.
    answered = []
    while time.monotonic() - started < CLIENT_TIMEOUT - 0.5:
        t0 = time.monotonic()
        assert requests.get(f"http://127.0.0.1:{layout.port}/openapi/v1/time", timeout=5).status_code == 200
        answered.append(time.monotonic() - t0)
        time.sleep(0.1)
    assert len(answered) >= 5, answered
    assert max(answered) < 1.0, answered
    # Every slow connection is closed by the server within the timeout (+ slack): recv ends.
    closed_after = []
    for sock in slow:
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        closed_after.append(time.monotonic() - started)
        sock.close()
        if data:  # nginx may answer 408 with the envelope before closing
            assert b" 408 " in data.split(b"\r\n", 1)[0], data[:300]
            assert b"-1010" in data, data[:300]
    assert max(closed_after) < CLIENT_TIMEOUT + 3, closed_after
    assert min(closed_after) >= CLIENT_TIMEOUT - 0.5, closed_after


def _listen_key(layout, world) -> str:
    response = requests.post(
        f"http://127.0.0.1:{layout.port}/openapi/v1/userDataStream",
        headers={"X-SERVICE-APIKEY": world["master"]["api_key"]},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return response.json()["listenKey"]


def _send_and_read_until_closed(ws, text: str, answers: list) -> None:
    ws.send(text)
    while True:
        answers.append(ws.recv(timeout=10))


def test_a_websocket_frame_over_the_bound_is_refused_by_daphne_with_1009(front):
    layout, world, log = front
    url = f"ws://127.0.0.1:{layout.port}/openapi/ws/{_listen_key(layout, world)}"
    # Under the bound (120 KB): read by the application, which answers (not JSON: an error) and stays open.
    with connect(url, open_timeout=10, proxy=None, max_size=None) as ws:
        ws.send("x" * (120 * 1024))
        answer = json.loads(ws.recv(timeout=10))
        assert answer, answer
        ws.send(json.dumps({"method": "LIST_SUBSCRIPTIONS", "id": 1}))
        assert ws.recv(timeout=10)
    # Over it (200 KB in one frame): Daphne (autobahn) fails the connection as soon as it reads the
    # frame's length: a 1009 close, or (its close frame lost to the reset of a socket with unread
    # data) a dropped connection; the application never gets the message: no answer comes back.
    with connect(url, open_timeout=10, proxy=None, max_size=None) as ws:
        started = time.monotonic()
        answers: list = []
        with pytest.raises(ConnectionClosed) as closed:
            _send_and_read_until_closed(ws, "x" * (200 * 1024), answers)
        assert answers == []
        assert time.monotonic() - started < 5
        assert closed.value.rcvd is None or closed.value.rcvd.code == 1009, (
            closed.value,
            Path(log).read_text()[-2000:],
        )
