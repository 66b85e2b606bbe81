"""nginx, the stack's front: found or installed from Debian's packages, and its configuration."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.layout import MAX_API_BODY_BYTES, MAX_BODY_BYTES, Layout


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if found:
        return found
    sys.stderr.write("Installing nginx from Debian packages (the full stack's front)\n")
    as_root = [] if os.geteuid() == 0 else ["sudo"]
    quiet = {"stdout": subprocess.DEVNULL}
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*as_root, "apt-get", "update", "-qq"], check=True, **quiet)  # noqa: S603 - fixed arguments
    # policy-rc.d 101: the package's own nginx service is not started (it would take port 80).
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy and os.geteuid() == 0:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        install = [*as_root, "apt-get", "install", "-y", "-qq"]
        subprocess.run([*install, "nginx-light"], check=False, env=apt_env, **quiet)  # noqa: S603 - fixed arguments
        if not Path("/usr/sbin/nginx").exists():
            subprocess.run([*install, "nginx"], check=True, env=apt_env, **quiet)  # noqa: S603 - fixed arguments
    finally:
        if not had_policy and os.geteuid() == 0:
            policy.unlink(missing_ok=True)
    return "/usr/sbin/nginx"


# What nginx itself refuses, answered in the gateway's envelope (-1010, the spec's bad request), by status.
NGINX_REFUSALS = {
    400: "Malformed request: headers too large or not HTTP.",
    408: "Request not received in time.",
    413: "Request body too large.",
    414: "Request line too long.",
}


def _refusal_locations() -> str:
    """nginx's error pages for NGINX_REFUSALS (494: request header too large, answered as 400)."""
    lines = [f"        error_page {'400 494' if code == 400 else code} /_refused/{code};" for code in NGINX_REFUSALS]
    for status, msg in NGINX_REFUSALS.items():
        lines += [
            f"        location = /_refused/{status} {{",
            "            internal;",
            "            default_type application/json;",
            f"            return {status} '{json.dumps({'code': -1010, 'msg': msg}, separators=(',', ':'))}';",
            "        }",
        ]
    return "\n".join(lines)


# The REST locations' proxying (the admin's and the API's differ only in their body bound).
_REST_PROXY = """\
            proxy_pass http://rest;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_buffering off;
            proxy_read_timeout 60s;
            proxy_send_timeout 30s;"""


def nginx_conf(layout: Layout) -> str:
    run = layout.run_dir
    refusals = _refusal_locations()
    ws_servers = "\n".join(f"        server 127.0.0.1:{port};" for port in layout.ws_ports)
    return f"""# Written by harness/nginx.py at every start; edit that file, not this one.
worker_processes 1;
pid {run}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log {run}/access.log combined buffer=256k flush=2s;
    client_body_temp_path {run}/nginx-body;
    proxy_temp_path {run}/nginx-proxy;
    fastcgi_temp_path {run}/nginx-fastcgi;
    uwsgi_temp_path {run}/nginx-uwsgi;
    scgi_temp_path {run}/nginx-scgi;
    server_tokens off;
    # Bounds on what a client sends (docs/api.md, "Request size"): a request line over 8 KB gets 414,
    # a header line over 8 KB or headers over 32 KB 400, a body over 16 KB (/openapi/) or 64 KB (the
    # admin) 413; a client that takes longer than {layout.client_timeout} s to send its headers, or
    # between two reads of its body, is dropped: nginx reads the whole request before a backend sees
    # it, so a slow client never holds a REST thread. Every refusal is the JSON envelope
    # {{code: -1010, msg}} with nginx's 4XX status.
    large_client_header_buffers 4 8k;
    client_max_body_size {MAX_BODY_BYTES // 1024}k;
    client_body_buffer_size {MAX_BODY_BYTES // 1024}k;  # a body never goes to a temporary file
    client_body_timeout {layout.client_timeout}s;
    client_header_timeout {layout.client_timeout}s;
    send_timeout 30s;
    proxy_connect_timeout 5s;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    upstream rest {{
        server 127.0.0.1:{layout.rest_port};
        keepalive 128;
    }}
    upstream ws {{
        least_conn;
{ws_servers}
    }}
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        '' close;
    }}
    server {{
        listen 127.0.0.1:{layout.port} reuseport backlog=4096;
        # (URIs, not named locations: a request line too long to parse has no URI to redirect from.)
{refusals}
        # (proxy_set_header is not inherited by a location that sets any: each sets all of its own.)
        location /openapi/ws/ {{
            proxy_pass http://ws;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_buffering off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }}
        location / {{
{_REST_PROXY}
        }}
        location /openapi/ {{
            client_max_body_size {MAX_API_BODY_BYTES // 1024}k;
{_REST_PROXY}
        }}
    }}
}}
"""
