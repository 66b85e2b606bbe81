"""The lab's application hosts (docs/scaling.md): app1 and app2, each in its own namespace, each
running the stack's programs as `make run` does (granian REST, Daphne, a Celery worker, a beat), and
HAProxy (Debian's `haproxy`) in the machine's namespace in front of them, checking each backend's
GET /openapi/v1/ping every second. Every beat runs RedBeat (CELERY_BEAT_SCHEDULER): one holds the
lock in Redis and sends the periodic tasks, the others wait for it. The beats start one after the
other (`start_beats`), so the first host holds the lock.

One supervisord (under LAB_DIR/apps, its own: the database and Redis hosts' supervisord is not
touched) that restarts a program which dies, as `make run`'s and as a production host's process
supervisor does (a beat exits when its Redis fails over; left down, no periodic job would run on that
host again). A killed host stays down all the same (`kill_host`: its programs frozen, marked stopped,
then SIGKILLed) until `start_programs` brings it back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request
import xmlrpc.client
from pathlib import Path

from harness.lab import net
from harness.lab.cluster import LabSupervisor
from harness.lab.topology import (
    APP_HOSTS,
    APP_REST_PORT,
    APP_WS_PORT,
    GATEWAY,
    LAB_DIR,
    PROXY_ADDRESS,
    Host,
)
from harness.layout import CLIENT_TIMEOUT_SECONDS, MAX_API_BODY_BYTES, MAX_BODY_BYTES, Layout
from harness.nginx import NGINX_REFUSALS
from harness.programs import Program, programs

RUN_DIR = LAB_DIR / "apps"
# RedBeat's lock (CELERY_REDBEAT_KEY_PREFIX + ":lock").
BEAT_LOCK_KEY = "redbeat::lock"
# HAProxy's health checks: every second, down after 2 failures, up again after 2 successes.
CHECK = "inter 1s fall 2 rise 2"
CHECK_TIMEOUT_SECONDS = 7  # above libpq's wait for the three db hosts (connect_timeout=2 each), see haproxy_cfg


def host_layout(host: Host, env: dict[str, str]) -> Layout:
    layout = Layout.from_env(env, port=APP_REST_PORT - 1, run_dir=RUN_DIR / host.name)
    layout.bind = host.address
    layout.rest_port, layout.ws_ports = APP_REST_PORT, [APP_WS_PORT]
    layout.rest_workers = int(env.get("LAB_APP_REST_WORKERS", "1"))  # two hosts share 2 cores
    layout.celery_concurrency = int(env.get("LAB_APP_CELERY_CONCURRENCY", "1"))
    return layout


def host_programs(host: Host, env: dict[str, str]) -> list[Program]:
    """The stack's programs (less nginx: HAProxy fronts every host) inside `host`'s namespace, named
    `<program>-<host>`; REST and Daphne on the host's address; the beat on RedBeat."""
    layout = host_layout(host, env)
    out = []
    for program in programs(layout, nginx="nginx"):
        if program.name == "nginx":
            continue
        own = dict(program.env)
        if program.name == "beat":
            own["CELERY_BEAT_SCHEDULER"] = "redbeat.RedBeatScheduler"
        # The port is on the host's address, which supervisor.py's wait (127.0.0.1) cannot see: wait_ready.
        out.append(Program(f"{program.name}-{host.name}", net.in_host(host, program.args), own))
    return out


# nginx's bounds (harness/nginx.py, docs/api.md "Request size"), kept by HAProxy itself:
# each refused with nginx's status before a backend sees the request, the body and request-line
# refusals in the gateway's envelope {code: -1010, msg} as nginx's. Headers must fit HAProxy's
# buffer less its rewrite reserve: 32 KB, as nginx's 4 x 8 KB.
HEADERS_BYTES = 32 * 1024
MAXREWRITE_BYTES = 1024
REQUEST_LINE_BYTES = 8 * 1024


def _refusal(status: int) -> str:
    return json.dumps({"code": -1010, "msg": NGINX_REFUSALS[status]}, separators=(",", ":"))


def haproxy_cfg(
    port: int,
    hosts: list[Host],
    *,
    binds: tuple[str, ...] = ("127.0.0.1", GATEWAY),
    rest_port: int = APP_REST_PORT,
    ws_port: int = APP_WS_PORT,
    source: str | None = PROXY_ADDRESS,
    run: Path = RUN_DIR,
) -> str:
    """Path routing as nginx's (/openapi/ws/ to Daphne, the rest to granian), X-Forwarded-For set to
    the client's address (any the client sent replaced; the hosts trust only HAProxy's own `source`
    address, TRUSTED_PROXIES),
    nginx's request bounds, a websocket tunnel kept for an hour (Daphne pings every 20 s), and a
    request whose connection to a backend failed retried on another (`redispatch`: it never reached
    the dead one, so nothing is done twice)."""
    rest = "\n".join(f"    server {h.name} {h.address}:{rest_port} check" for h in hosts)
    # A websocket's session to a host marked down is closed (its clients connect again elsewhere and
    # resync); a REST request in flight is left to finish (cutting it would make its outcome unknown).
    ws = "\n".join(f"    server {h.name} {h.address}:{ws_port} check on-marked-down shutdown-sessions" for h in hosts)
    listen = "\n".join(f"    bind {address}:{port}" for address in binds)
    refused = [
        (414, f"{{ url,length gt {REQUEST_LINE_BYTES} }}"),
        (413, f"api {{ req.hdr_val(content-length) gt {MAX_API_BODY_BYTES} }}"),
        (413, f"api {{ req.body_size gt {MAX_API_BODY_BYTES} }}"),
        (413, f"{{ req.hdr_val(content-length) gt {MAX_BODY_BYTES} }}"),
    ]
    bounds = "\n".join(
        f"    http-request return status {status} content-type application/json string '{_refusal(status)}' if {when}"
        for status, when in refused
    )
    return f"""# Written by harness/lab/apphosts.py at every start.
global
    maxconn 8000  # two descriptors a connection: within the lab's open-file limit (20000)
    pidfile {run}/haproxy.pid
    stats socket {run}/haproxy.sock mode 600 level admin
    log stderr format short local0 warning
    # A request's line and headers must fit in the buffer less the rewrite reserve (else 400).
    tune.bufsize {HEADERS_BYTES + MAXREWRITE_BYTES}
    tune.maxrewrite {MAXREWRITE_BYTES}

defaults
    mode http
    log global
    option dontlognull
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # nginx's client_header_timeout: the whole request (its body too, buffered below) within this,
    # so a slow client holds an HAProxy connection, never a REST thread.
    timeout http-request {CLIENT_TIMEOUT_SECONDS}s
    timeout http-keep-alive 75s
    timeout tunnel 1h
    timeout client-fin 5s
{f"    source {source}  # the address the app hosts trust (TRUSTED_PROXIES)" if source else ""}
    option redispatch
    retries 2
    default-server {CHECK}
    # A check answered within this: a host whose REST threads all wait on the database (a PostgreSQL
    # failover: libpq tries the three hosts, connect_timeout=2 each) answers its ping late, and is
    # not dead; marking every host down then turned the service's 503 -1001 into HAProxy's own 503
    # (no code), and cut the requests in flight (502, their outcome unknown). A dead host refuses
    # the connection at once.
    timeout check {CHECK_TIMEOUT_SECONDS}s
    # HAProxy's own 400 (headers over 32 KB) and 408 (too slow) are its HTML pages: in 2.6 a request
    # its HTTP/1 layer refuses never reaches `errorfile` (haproxy/haproxy#3032, fixed in 3.2).

frontend front
{listen}
    # The body read before the request goes on (as nginx does), so a chunked body's size is known.
    option http-buffer-request
    acl api path_beg /openapi/
{bounds}
    # Replaces every X-Forwarded-For (and drops X-Real-IP) the client sent: the hosts believe this one.
    http-request set-header X-Forwarded-For %[src]
    http-request del-header X-Real-IP
    acl websocket path_beg /openapi/ws/
    use_backend ws if websocket
    default_backend rest

backend rest
    balance roundrobin
    option httpchk
    http-check send meth GET uri /openapi/v1/ping ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
{rest}

backend ws
    balance roundrobin
    option httpchk
    http-check send meth GET uri /openapi/v1/ping ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
{ws}
"""


def write_haproxy(run: Path, port: int, hosts: list[Host], **options) -> Path:
    """HAProxy's configuration in `run`; its path."""
    cfg = run / "haproxy.cfg"
    cfg.write_text(haproxy_cfg(port, hosts, run=run, **options))
    return cfg


def haproxy_binary() -> str:
    return shutil.which("haproxy") or "/usr/sbin/haproxy"


class AppSupervisor(LabSupervisor):
    """The app hosts' supervisord: programs restarted when they die (not the lab's `autorestart=false`),
    the beats not started at once (`start_beats` starts them in turn)."""

    def conf_text(self, text: str) -> str:
        text = text.replace("autorestart=false\nstartsecs=1", "autorestart=true\nstartsecs=1")
        return re.sub(r"(\[program:beat-[^\]]+\]\n(?:[^\[]*?))autostart=true", r"\1autostart=false", text)


def app_env(base: dict[str, str]) -> dict[str, str]:
    """The hosts' environment: HAProxy (its own source address) trusted for X-Forwarded-For; the hosts'
    own addresses allowed as Host (HAProxy's checks and the direct pings); the simulated chain's
    block every second (the beat's takeover is timed by it)."""
    hosts = ",".join(["127.0.0.1", "localhost", GATEWAY, *(h.address for h in APP_HOSTS)])
    return base | {
        "TRUSTED_PROXIES": PROXY_ADDRESS,
        "ALLOWED_HOSTS": hosts,
        "SIM_CHAIN_BLOCK_SECONDS": base.get("SIM_CHAIN_BLOCK_SECONDS", "1"),
    }


def supervisor(env: dict[str, str], port: int, hosts: list[Host] = APP_HOSTS) -> AppSupervisor:
    for host in hosts:
        (RUN_DIR / host.name).mkdir(parents=True, exist_ok=True)
    cfg = write_haproxy(RUN_DIR, port, hosts)
    progs = [p for h in hosts for p in host_programs(h, env)]
    progs.append(Program("haproxy", [haproxy_binary(), "-db", "-f", str(cfg)]))
    return AppSupervisor(progs, env, RUN_DIR)


def ping(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/openapi/v1/ping", timeout=timeout) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait_ready(hosts: list[Host], port: int, timeout: float = 120.0) -> None:
    """Every host's REST and Daphne answer, and HAProxy in front of them."""
    deadline = time.monotonic() + timeout
    for address, p in [*((h.address, q) for h in hosts for q in (APP_REST_PORT, APP_WS_PORT)), ("127.0.0.1", port)]:
        while not ping(address, p):
            if time.monotonic() > deadline:
                raise SystemExit(f"app hosts not ready after {timeout:.0f} s: {address}:{p} (log {RUN_DIR}/lab.log)")
            time.sleep(0.5)


def start_beats(sup: AppSupervisor, redis_client, hosts: list[Host] = APP_HOSTS, timeout: float = 60.0) -> None:
    """The first host's beat, until it holds RedBeat's lock; then the others (they wait for it)."""
    sup.rpc().startProcess(f"beat-{hosts[0].name}", True)
    deadline = time.monotonic() + timeout
    while not redis_client.exists(BEAT_LOCK_KEY):
        if time.monotonic() > deadline:
            raise SystemExit(f"beat-{hosts[0].name} did not take RedBeat's lock in {timeout:.0f} s")
        time.sleep(0.2)
    for host in hosts[1:]:
        sup.rpc().startProcess(f"beat-{host.name}", True)


def kill_host(sup: AppSupervisor, host: Host) -> int:
    """The machine lost: every process in the host's namespace frozen (SIGSTOP: nothing of a graceful
    stop can run), its programs marked stopped in supervisord (so that it does not restart them: the
    TERM it sends stays pending in the frozen processes), then SIGKILL to them all. Its address stays,
    silent, until `start_programs`."""
    pids = net.pids(host)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    for name in PROGRAMS:
        with contextlib.suppress(xmlrpc.client.Fault):  # not running (a beat not started yet)
            sup.rpc().stopProcess(f"{name}-{host.name}", False)
    for pid in set(pids) | set(net.pids(host)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def stop_host(sup: AppSupervisor, host: Host) -> None:
    """Stop one host's programs in order (a graceful leave: the throughput run's single host)."""
    for name in ("rest", "ws", "worker", "beat"):
        info = sup.rpc().getProcessInfo(f"{name}-{host.name}")
        if info["statename"] == "RUNNING":
            sup.rpc().stopProcess(f"{name}-{host.name}", True)


# --- HAProxy's runtime API (its stats socket, `level admin`) and a host's graceful restart -------------

BACKENDS = ("rest", "ws")
PROGRAMS = ("rest", "ws", "worker", "beat")  # stopped in this order, started in reverse


def haproxy(command: str, timeout: float = 5.0) -> str:
    """One command on HAProxy's stats socket; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(RUN_DIR / "haproxy.sock"))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def set_state(host: Host, state: str) -> None:
    """`ready`, `drain` (no new request or connection; those open stay) or `maint` in both backends."""
    for backend in BACKENDS:
        answer = haproxy(f"set server {backend}/{host.name} state {state}").strip()
        if answer:
            raise RuntimeError(f"HAProxy: set server {backend}/{host.name} state {state}: {answer}")


def server_stats(host: Host) -> dict[str, dict[str, str]]:
    """`show stat` of the host's servers: backend -> {status, scur, ...}."""
    lines = haproxy("show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") == host.name and row.get("pxname") in BACKENDS:
            out[row["pxname"]] = row
    return out


def drain(host: Host, timeout: float = 10.0) -> float:
    """The host drained: HAProxy sends it nothing new; seconds until its REST requests are over (the
    websockets stay: Daphne closes them when it stops)."""
    began = time.monotonic()
    set_state(host, "drain")
    while time.monotonic() - began < timeout and int(server_stats(host).get("rest", {}).get("scur") or 0):
        time.sleep(0.1)
    return time.monotonic() - began


def stop_programs(sup: AppSupervisor, host: Host) -> None:
    """The host's programs stopped gracefully (SIGTERM, supervisord's wait): granian finishes its
    requests, Daphne's websockets end (the clients connect again to the other host), the worker
    finishes its task, the beat gives up its lock."""
    for name in PROGRAMS:
        if sup.rpc().getProcessInfo(f"{name}-{host.name}")["statename"] == "RUNNING":
            sup.rpc().stopProcess(f"{name}-{host.name}", True)


def start_programs(sup: AppSupervisor, host: Host, port: int) -> None:
    for name in reversed(PROGRAMS):
        if sup.rpc().getProcessInfo(f"{name}-{host.name}")["statename"] != "RUNNING":
            sup.rpc().startProcess(f"{name}-{host.name}", True)
    wait_ready([host], port)


def wait_up(host: Host, timeout: float = 30.0) -> bool:
    """Until HAProxy's checks see the host up in both backends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = server_stats(host)
        if all(stats.get(b, {}).get("status", "").startswith("UP") for b in BACKENDS):
            return True
        time.sleep(0.2)
    return False
