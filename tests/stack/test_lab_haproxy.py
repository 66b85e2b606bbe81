"""The lab's HAProxy (harness/lab/apphosts.py) for real, with the configuration the lab writes,
in front of the application (pytest-django's live server) instead of the app hosts, without the lab's
namespaces: the client's address is the one HAProxy saw, whatever X-Forwarded-For or X-Real-IP the
client sent, on the REST and the websocket paths, so an API key restricted to an address cannot be
used from another; and nginx's request bounds are kept, refused with nginx's answers. Clients on
different loopback addresses (127.0.0.2, 127.0.0.3) stand for different machines; HAProxy reaches
the backends from 127.0.0.1, the one trusted proxy (TRUSTED_PROXIES)."""

from __future__ import annotations

import http.client
import http.server
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness.client import Signer
from harness.lab import apphosts
from harness.lab.topology import Host
from harness.nginx import NGINX_REFUSALS
from harness.ports import HOST, free_port

pytestmark = pytest.mark.skipif(not shutil.which("haproxy"), reason="Debian's haproxy is not installed")

CLIENT_A, CLIENT_B = "127.0.0.2", "127.0.0.3"
API_KEYS = "/openapi/v1/api-keys"
USER_IP = "/openapi/v1/user/ip"


class _Echo(http.server.BaseHTTPRequestHandler):
    """The websocket backend's stand-in: 200 to HAProxy's checks, else the forwarding headers it got."""

    def do_GET(self):
        body = json.dumps({"xff": self.headers.get_all("X-Forwarded-For"), "real": self.headers.get("X-Real-IP")})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def haproxy(live_server, settings, tmp_path):
    """HAProxy on a free port of 127.0.0.1, its REST backend the live server, its websocket backend
    the echo server; its address once both backends are up."""
    settings.TRUSTED_PROXIES = [HOST]
    echo = http.server.ThreadingHTTPServer((HOST, 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    port = free_port()
    rest_port = urlsplit(live_server.url).port
    cfg = apphosts.write_haproxy(
        tmp_path,
        port,
        [Host("local", HOST)],
        binds=(HOST,),
        rest_port=rest_port,
        ws_port=echo.server_port,
        source=HOST,  # the trusted proxy's address here
    )
    proc = subprocess.Popen([apphosts.haproxy_binary(), "-db", "-f", str(cfg)], stderr=subprocess.PIPE)  # noqa: S603
    try:
        deadline = time.monotonic() + 20
        while _get(port, "/openapi/v1/ping")[0] != 200 or _get(port, "/openapi/ws/probe")[0] != 200:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "HAProxy's backends not up in 20 s"
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        echo.shutdown()


def _get(port, path, *, source=HOST, headers=None, method="GET", body=None):
    conn = http.client.HTTPConnection(HOST, port, timeout=10, source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=False)
        answer = conn.getresponse()
        return answer.status, answer.read()
    except (ConnectionError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def _signed(api_key, secret) -> str:
    return f"{API_KEYS}?{Signer(api_key.key, secret).signed({})}"


@pytest.mark.django_db(transaction=True)
def test_a_key_restricted_to_a_is_refused_from_b_that_forges_x_forwarded_for(haproxy, master, make_key):
    api_key, secret = make_key(master, ip_list=[CLIENT_A])
    forged = {"X-Forwarded-For": CLIENT_A, "X-Real-IP": CLIENT_A, "X-SERVICE-APIKEY": api_key.key}
    status, body = _get(haproxy, _signed(api_key, secret), source=CLIENT_B, headers=forged)
    assert status == 401
    assert json.loads(body)["code"] == -2017
    assert CLIENT_B in json.loads(body)["msg"]  # the address HAProxy saw, not the one claimed
    # From A itself, through the trusted proxy: accepted.
    status, body = _get(haproxy, _signed(api_key, secret), source=CLIENT_A, headers={"X-SERVICE-APIKEY": api_key.key})
    assert status == 200, body
    assert [item["apiKey"] for item in json.loads(body)] == [api_key.key]


@pytest.mark.django_db(transaction=True)
def test_the_application_sees_the_peer_of_haproxy_whatever_the_client_claims(haproxy, live_server):
    forged = {"X-Forwarded-For": "203.0.113.9, 127.0.0.1", "X-Real-IP": "203.0.113.9"}
    status, body = _get(haproxy, USER_IP, source=CLIENT_B, headers=forged)
    assert (status, json.loads(body)) == (200, {"ip": CLIENT_B})
    # A peer that is not the proxy is not believed either (straight to the backend).
    direct = urlsplit(live_server.url).port
    status, body = _get(direct, USER_IP, source=CLIENT_B, headers={"X-Forwarded-For": CLIENT_A})
    assert (status, json.loads(body)) == (200, {"ip": CLIENT_B})


@pytest.mark.django_db(transaction=True)
def test_the_websocket_path_gets_the_same_header(haproxy):
    forged = {"X-Forwarded-For": CLIENT_A, "X-Real-IP": CLIENT_A}
    status, body = _get(haproxy, "/openapi/ws/probe", source=CLIENT_B, headers=forged)
    assert (status, json.loads(body)) == (200, {"xff": [CLIENT_B], "real": None})


def _refused(status: int) -> dict:
    return {"code": -1010, "msg": NGINX_REFUSALS[status]}


@pytest.mark.django_db(transaction=True)
def test_nginx_bounds_are_kept_with_nginx_answers(haproxy):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, body = _get(haproxy, "/openapi/v1/ping", method="POST", body=b"a=" + b"x" * 16 * 1024, headers=form)
    assert (status, json.loads(body)) == (413, _refused(413))
    # A chunked body has no Content-Length: HAProxy reads it first and counts.
    chunked = {**form, "Transfer-Encoding": "chunked"}
    big = b"x" * 17 * 1024
    raw = f"{len(big):x}\r\n".encode() + big + b"\r\n0\r\n\r\n"
    status, body = _get(haproxy, "/openapi/v1/ping", method="POST", body=iter([raw]), headers=chunked)
    assert (status, json.loads(body)) == (413, _refused(413))
    status, body = _get(haproxy, "/openapi/v1/ping?" + "a" * 9 * 1024)
    assert (status, json.loads(body)) == (414, _refused(414))
    # Headers over 32 KB: nginx's status. (HAProxy 2.6 answers its own HTML page there: a request
    # its HTTP/1 layer refuses ignores `errorfile`, haproxy/haproxy#3032, fixed in 3.2.)
    status, body = _get(haproxy, "/openapi/v1/ping", headers={f"X-Big-{i}": "y" * 4000 for i in range(9)})
    assert status == 400
    # Within the bounds: through to the application.
    assert _get(haproxy, "/openapi/v1/ping", headers={"X-Big": "y" * 4000})[0] == 200


def test_a_client_too_slow_with_its_headers_is_answered_408(tmp_path):
    """timeout http-request (nginx's client_header_timeout): HAProxy answers alone, no backend needed,
    so a slow client never holds a REST thread."""
    port = free_port()
    cfg = apphosts.write_haproxy(
        tmp_path, port, [Host("none", HOST)], binds=(HOST,), rest_port=free_port(), source=None
    )
    text = cfg.read_text().replace("timeout http-request 10s", "timeout http-request 1s")
    cfg.write_text(text)
    proc = subprocess.Popen([apphosts.haproxy_binary(), "-db", "-f", str(cfg)], stderr=subprocess.DEVNULL)  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                sock = socket.create_connection((HOST, port), timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with sock:
            sock.sendall(b"GET /openapi/v1/ping HTTP/1.1\r\nHost: x\r\n")  # and no end of headers
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408")  # HAProxy's own page (see the 400 above)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- HAProxy's checks, for real: two stand-in app hosts on loopback addresses of their own -----------


class _Host(http.server.BaseHTTPRequestHandler):
    """An app host's REST and Daphne stand-in: its ping answers per `server.ping` ("ok", "fail": 500,
    "slow": 200 after SLOW_PING_SECONDS) and counts `server.slow_pings`; anything else is its name."""

    def do_GET(self):
        status, body = 200, self.server.name
        if self.path.startswith("/openapi/v1/ping"):
            if self.server.ping == "fail":
                status = 500
            elif self.server.ping == "slow":
                time.sleep(SLOW_PING_SECONDS)
                self.server.slow_pings += 1
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


# Slower than HAProxy's default check timeout and libpq's 2 s per database host; within the lab's.
SLOW_PING_SECONDS = 3


def _stand_in(name: str, address: str, port: int) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer((address, port), _Host)
    server.name, server.ping, server.slow_pings = name, "ok", 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_haproxy_takes_a_host_whose_ping_fails_out_of_both_backends_and_keeps_one_whose_ping_is_slow(monkeypatch):
    from tests.support.waiting import wait_until

    run = Path(tempfile.mkdtemp(prefix="hap-"))  # the stats socket's path must be short
    monkeypatch.setattr(apphosts, "RUN_DIR", run)
    hosts = [Host("app1", "127.0.0.4"), Host("app2", "127.0.0.5")]
    rest_port, ws_port, port = free_port(), free_port(), free_port()
    servers = {h.name: [_stand_in(h.name, h.address, p) for p in (rest_port, ws_port)] for h in hosts}
    cfg = apphosts.write_haproxy(run, port, hosts, binds=(HOST,), rest_port=rest_port, ws_port=ws_port, source=HOST)
    proc = subprocess.Popen([apphosts.haproxy_binary(), "-db", "-f", str(cfg)], stderr=subprocess.DEVNULL)  # noqa: S603

    def statuses(host: Host) -> set[str]:
        try:
            return {row["status"] for row in apphosts.server_stats(host).values()}
        except OSError:
            return set()

    def answered_by() -> set[str]:
        return {_get(port, f"/who?{n}")[1].decode() for n in range(10)}

    try:
        for host in hosts:
            wait_until(lambda host=host: statuses(host) == {"UP"}, what=f"{host.name} up in both backends")
        assert answered_by() == {"app1", "app2"}

        for server in servers["app1"]:
            server.ping = "fail"
        wait_until(lambda: statuses(hosts[0]) == {"DOWN"}, what="app1 down in both backends")
        assert statuses(hosts[1]) == {"UP"}
        assert answered_by() == {"app2"}
        assert _get(port, "/openapi/ws/who")[1] == b"app2"

        for server in servers["app1"]:
            server.ping = "slow"
        wait_until(lambda: statuses(hosts[0]) == {"UP"}, timeout=60, what="app1 up again on slow pings")
        seen = servers["app1"][0].slow_pings
        wait_until(lambda: servers["app1"][0].slow_pings >= seen + 2, timeout=60, what="two more slow pings")
        assert statuses(hosts[0]) == {"UP"}  # a slow ping is a busy host, not a dead one
        assert answered_by() == {"app1", "app2"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for pair in servers.values():
            for server in pair:
                server.shutdown()
        shutil.rmtree(run, ignore_errors=True)
