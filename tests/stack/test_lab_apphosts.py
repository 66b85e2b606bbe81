"""The lab's application hosts (docs/scaling.md) as configuration, without the lab (it needs root and
namespaces: `python -m exchange.stack.lab hostfault` runs it): HAProxy checks every backend and keeps
websockets past Daphne's pings, each host runs the stack's programs on its own address, the beats run
RedBeat and wait to be started in turn; RedBeat's settings through Sentinel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from exchange.stack.lab import apphosts
from exchange.stack.lab.topology import APP_HOSTS, APP_REST_PORT, APP_WS_PORT
from exchange.stack.supervisor import supervisord_conf


def test_haproxy_checks_both_backends_of_every_host_and_keeps_websockets_open():
    cfg = apphosts.haproxy_cfg(18000, APP_HOSTS)
    assert cfg.count("http-check send meth GET uri /openapi/v1/ping") == 2
    for host in APP_HOSTS:
        assert f"server {host.name} {host.address}:{APP_REST_PORT} check" in cfg
        assert f"server {host.name} {host.address}:{APP_WS_PORT} check" in cfg
    assert "use_backend ws if websocket" in cfg
    assert "path_beg /openapi/ws/" in cfg
    assert "timeout tunnel 1h" in cfg  # Daphne pings every 20 s: far inside it
    assert "http-request set-header X-Forwarded-For %[src]" in cfg


def test_each_host_runs_the_stack_programs_on_its_address_and_beats_wait_their_turn():
    progs = apphosts.host_programs(APP_HOSTS[1], {})
    names = [p.name for p in progs]
    assert names == ["rest-app2", "ws-app2", "worker-app2", "beat-app2"]
    rest, ws, _worker, beat = progs
    assert rest.args[:4] == ["ip", "netns", "exec", "xlab-app2"]
    assert rest.args[rest.args.index("--host") + 1] == APP_HOSTS[1].address
    assert ws.args[ws.args.index("-b") + 1] == APP_HOSTS[1].address
    assert beat.env["CELERY_BEAT_SCHEDULER"] == "redbeat.RedBeatScheduler"
    sup = apphosts.AppSupervisor(progs, {}, apphosts.RUN_DIR)
    conf = sup.conf_text(supervisord_conf(progs, apphosts.RUN_DIR))
    beat_section = conf.split("[program:beat-app2]")[1]
    assert "autostart=false" in beat_section
    assert "autostart=true" in conf.split("[program:rest-app2]")[1].split("[program:")[0]


_DUMP = """
import json
from exchange.settings import base as s
print(json.dumps({n: getattr(s, n, None) for n in ("CELERY_BEAT_SCHEDULER", "CELERY_REDBEAT_REDIS_URL",
    "CELERY_REDBEAT_REDIS_OPTIONS", "CELERY_REDBEAT_LOCK_TIMEOUT", "CELERY_BEAT_MAX_LOOP_INTERVAL")}))
"""


def _settings(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDIS_", "CELERY_"))}
    done = subprocess.run(  # noqa: S603 - this interpreter on our own settings
        [sys.executable, "-c", _DUMP], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_redbeat_through_sentinel_and_the_default_beat_unchanged():
    default = _settings(REDIS_URL="redis://127.0.0.1:6379/3")
    assert default["CELERY_BEAT_SCHEDULER"] == "celery.beat:PersistentScheduler"
    assert default["CELERY_REDBEAT_LOCK_TIMEOUT"] is None
    red = _settings(
        CELERY_BEAT_SCHEDULER="redbeat.RedBeatScheduler",
        REDIS_SENTINELS="10.77.0.21:26379,10.77.0.22:26379",
        REDIS_URL="redis://mymaster/2",
    )
    assert red["CELERY_REDBEAT_REDIS_URL"].startswith("redis-sentinel")
    options = red["CELERY_REDBEAT_REDIS_OPTIONS"]
    assert options["sentinels"] == [["10.77.0.21", 26379], ["10.77.0.22", 26379]]
    assert options["service_name"] == "mymaster"
    assert options["db"] == 2
    assert red["CELERY_REDBEAT_LOCK_TIMEOUT"] == 10
    assert red["CELERY_BEAT_MAX_LOOP_INTERVAL"] * 5 <= red["CELERY_REDBEAT_LOCK_TIMEOUT"]


def test_the_hosts_trust_haproxys_own_source_address_only():
    """HAProxy dials the hosts from an address of its own; the machine's other processes (the bridge's
    primary address) reaching a host directly are not believed when they send X-Forwarded-For."""
    from exchange.stack.lab.topology import GATEWAY, PROXY_ADDRESS

    cfg = apphosts.haproxy_cfg(18000, APP_HOSTS)
    assert f"source {PROXY_ADDRESS} " in cfg
    assert "http-request del-header X-Real-IP" in cfg
    env = apphosts.app_env({})
    assert env["TRUSTED_PROXIES"] == PROXY_ADDRESS != GATEWAY
