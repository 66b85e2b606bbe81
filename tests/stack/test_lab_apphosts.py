"""The lab's application hosts (docs/scaling.md) without the lab (it needs root and namespaces:
`python -m harness.lab hostfault` runs it): the lab's and the app hosts' supervisord for real
over stand-in programs (a killed app-host program started again, its beat left for the lab to start,
a killed lab program left down), with the configuration their `start` writes; the rest is the
configuration's text and settings, named as such (HAProxy running that configuration:
tests/stack/test_lab_haproxy.py); the rolling restart's drain on a stand-in stats socket; hostfault's
and the lab simulation's judgements."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import xmlrpc.client
from pathlib import Path

import pytest

from harness.lab import apphosts, cluster, topology
from harness.lab.topology import APP_HOSTS, APP_REST_PORT, APP_WS_PORT
from harness.programs import Program
from tests.support.waiting import wait_until


def test_haproxy_configuration_checks_every_host_in_both_backends_and_tunnels_websockets_an_hour():
    """The configuration's text (HAProxy taking a host whose ping fails out of both backends, for real:
    tests/stack/test_lab_haproxy.py)."""
    cfg = apphosts.haproxy_cfg(18000, APP_HOSTS)
    assert cfg.count("http-check send meth GET uri /openapi/v1/ping") == 2
    for host in APP_HOSTS:
        assert f"server {host.name} {host.address}:{APP_REST_PORT} check" in cfg
        assert f"server {host.name} {host.address}:{APP_WS_PORT} check" in cfg
    assert "use_backend ws if websocket" in cfg
    assert "path_beg /openapi/ws/" in cfg
    assert "timeout tunnel 1h" in cfg  # Daphne pings every 20 s: far inside it
    assert "http-request set-header X-Forwarded-For %[src]" in cfg


def test_each_hosts_programs_are_the_stacks_in_its_namespace_on_its_address_with_a_redbeat_beat():
    progs = apphosts.host_programs(APP_HOSTS[1], {})
    names = [p.name for p in progs]
    assert names == ["rest-app2", "ws-app2", "worker-app2", "beat-app2"]
    rest, ws, _worker, beat = progs
    assert rest.args[:4] == ["ip", "netns", "exec", "xlab-app2"]
    assert rest.args[rest.args.index("--host") + 1] == APP_HOSTS[1].address
    assert ws.args[ws.args.index("-b") + 1] == APP_HOSTS[1].address
    assert beat.env["CELERY_BEAT_SCHEDULER"] == "redbeat.RedBeatScheduler"


# --- the supervisords, for real: the lab's and the app hosts' configurations over stand-in programs -----


def _stand_ins() -> list[Program]:
    """An app host's programs by name, each a process that waits (the namespaces need the lab)."""
    waits = [sys.executable, "-c", "import time; time.sleep(3600)"]
    return [Program(f"{name}-appx", waits) for name in apphosts.PROGRAMS]


def _state(sup, name: str) -> tuple[str, int]:
    """supervisord's state and pid of program `name` (("", 0) while supervisord does not answer)."""
    try:
        info = sup.rpc().getProcessInfo(name)
    except (OSError, xmlrpc.client.Fault):
        return "", 0
    return info["statename"], int(info["pid"])


@contextlib.contextmanager
def _supervised(cls):
    """`cls` (the lab's or the app hosts' supervisor) started over the stand-ins with the very
    configuration its start writes, in a directory of its own (a unix socket's path must be short);
    stopped at the end."""
    run_dir = Path(tempfile.mkdtemp(prefix="sup-"))
    sup = cls(_stand_ins(), dict(os.environ), run_dir)
    sup.start()
    try:
        wait_until(lambda: _state(sup, "rest-appx")[0] == "RUNNING", what="rest-appx running")
        yield sup
    finally:
        sup.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_the_app_hosts_supervisord_restarts_a_program_that_dies_and_leaves_the_beat_to_be_started():
    """Simulation seed 1 on the lab: both beats exited at a Redis failover and, left down (the lab's
    `autorestart=false`), no periodic job ran again (deposits never credited). The app hosts'
    supervisord starts a killed program again; their beats wait to be started in turn."""
    with _supervised(apphosts.AppSupervisor) as sup:
        assert sup.conf.read_text() == sup.configuration()
        for name in ("ws-appx", "worker-appx"):
            wait_until(lambda name=name: _state(sup, name)[0] == "RUNNING", what=f"{name} running")
        assert _state(sup, "beat-appx") == ("STOPPED", 0)  # not started with the others
        for name in ("rest-appx", "worker-appx"):
            _, pid = _state(sup, name)
            os.kill(pid, signal.SIGKILL)
            wait_until(
                lambda name=name, pid=pid: _state(sup, name)[0] == "RUNNING" and _state(sup, name)[1] != pid,
                what=f"{name} started again",
            )
        sup.rpc().startProcess("beat-appx")
        assert _state(sup, "beat-appx")[0] == "RUNNING"


def test_the_labs_supervisord_leaves_a_killed_host_down():
    """A lab host that dies stays down, as a machine would, until a fault brings it back. supervisord
    restarts an EXITED program at its next pass over its programs; each RPC is answered in a pass, so
    EXITED seen again after another RPC is a program it did not restart."""
    with _supervised(cluster.LabSupervisor) as sup:
        _, pid = _state(sup, "rest-appx")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _state(sup, "rest-appx")[0] == "EXITED", what="rest-appx exited")
        sup.rpc().getState()
        assert _state(sup, "rest-appx") == ("EXITED", 0)
        assert sup.restarts()["rest-appx"] == 0
        sup.rpc().startProcess("rest-appx")  # what a fault's `start(name)` does
        assert _state(sup, "rest-appx")[0] == "RUNNING"


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


def test_haproxy_configuration_sets_its_own_source_address_and_the_hosts_trust_only_it():
    """HAProxy dials the hosts from an address of its own; the machine's other processes (the bridge's
    primary address) reaching a host directly are not believed when they send X-Forwarded-For."""
    from harness.lab.topology import GATEWAY, PROXY_ADDRESS

    cfg = apphosts.haproxy_cfg(18000, APP_HOSTS)
    assert f"source {PROXY_ADDRESS} " in cfg
    assert "http-request del-header X-Real-IP" in cfg
    env = apphosts.app_env({})
    assert env["TRUSTED_PROXIES"] == PROXY_ADDRESS != GATEWAY


# --- the rolling restart's drain on HAProxy's runtime API (a stand-in stats socket) --------------------

_STAT = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status\n"
    "rest,app1,0,0,{scur},3,,10,0,0,,0,,0,0,0,0,{status}\n"
    "rest,app2,0,0,2,3,,10,0,0,,0,,0,0,0,0,UP\n"
    "ws,app1,0,0,1,2,,5,0,0,,0,,0,0,0,0,{status}\n"
)


def _fake_haproxy(run_dir, answers):
    """A unix socket at run_dir/haproxy.sock answering as HAProxy's stats socket; the commands it got."""
    import socket
    import threading

    got = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(run_dir / "haproxy.sock"))
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                command = conn.recv(4096).decode().strip()
                got.append(command)
                conn.sendall(answers(command).encode())

    threading.Thread(target=serve, daemon=True).start()
    return got, server


def test_drain_sets_both_backends_and_waits_for_the_rest_requests_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(apphosts, "RUN_DIR", tmp_path)
    scur = iter([2, 1, 0])

    def answers(command):
        if command == "show stat":
            return _STAT.format(scur=next(scur, 0), status="DRAIN")
        return "\n"  # a `set server` that worked answers an empty line

    got, server = _fake_haproxy(tmp_path, answers)
    try:
        apphosts.drain(APP_HOSTS[0], timeout=5)
        apphosts.set_state(APP_HOSTS[0], "maint")
    finally:
        server.close()
    sets = [c for c in got if c.startswith("set server")]
    assert sets == [
        "set server rest/app1 state drain",
        "set server ws/app1 state drain",
        "set server rest/app1 state maint",
        "set server ws/app1 state maint",
    ]
    assert got.count("show stat") == 3  # until app1's REST sessions were 0


def test_a_refused_runtime_command_is_an_error_and_up_means_up_in_both_backends(tmp_path, monkeypatch):

    monkeypatch.setattr(apphosts, "RUN_DIR", tmp_path)
    status = iter(["MAINT", "DOWN 1/2", "UP"])

    def answers(command):
        if command == "show stat":
            return _STAT.format(scur=0, status=next(status, "UP"))
        return "No such server.\n"

    _got, server = _fake_haproxy(tmp_path, answers)
    try:
        with pytest.raises(RuntimeError, match="No such server"):
            apphosts.set_state(APP_HOSTS[0], "ready")
        assert apphosts.server_stats(APP_HOSTS[0])["rest"]["status"] == "MAINT"
        assert apphosts.wait_up(APP_HOSTS[0], timeout=5)
    finally:
        server.close()


# --- hostfault's transfers: every one answered and once in the database ---------------------------------


def test_a_transfer_left_unanswered_or_made_twice_fails_and_a_retry_duplicate_counts_once():
    from harness.lab.hostfault import DUPLICATE, Sent, judge_transfers

    book = {"lab-h0": ["10"], "lab-h1": ["11"], "lab-h3": ["13", "14"], "lab-h5": ["15"]}
    ok = [
        Sent("lab-h0", 200, ref="10"),
        # in flight on the killed host, made there; the retry is told duplicate and finds it by client id
        Sent("lab-h1", 400, DUPLICATE, ref="11", first=None, attempts=3),
        # in flight, never reached the database; made by the retry
        Sent("lab-h2", 400, -1131),
    ]
    assert judge_transfers(ok, book) == []
    bad = judge_transfers(
        [
            Sent("lab-h3", 200, ref="13"),  # twice in the database
            Sent("lab-h4", None, attempts=5),  # never answered
            Sent("lab-h5", 400, -1131),  # refused but made
            Sent("lab-h6", 400, DUPLICATE, ref=None, attempts=2),  # duplicate of nothing
        ],
        book,
    )
    assert [b.split(":")[0] for b in bad] == ["lab-h3", "lab-h4", "lab-h5", "lab-h6"]


# --- simulate --lab: its faults ---------------------------------------------------------------------------


def test_the_lab_simulation_draws_an_app_host_kill_and_drops_connections_on_its_own_database():
    import inspect

    from harness.simulation import faults
    from harness.simulation.lab import LAB_FAULTS, OWN_FAULTS, LabSimulation, lab_fault_plan

    assert "app-kill" in LAB_FAULTS
    assert "connections_dropped" in OWN_FAULTS
    long_plan = [name for _, name in lab_fault_plan(2831, 60)]
    assert set(long_plan) == {*LAB_FAULTS, *OWN_FAULTS}
    assert lab_fault_plan(2831, 5) == lab_fault_plan(2831, 5)
    assert LabSimulation.on_app_hosts
    source = inspect.getsource(faults.Faults.fault)
    assert "datname = current_database()" in source
    assert "datname = 'sim'" not in source


def test_the_beat_watch_counts_a_period_run_twice_but_not_its_own_first_reading():
    from harness.lab.hostfault import Heights

    heights = Heights(None)
    # the watch began at 100.0 (count 7) and the next run came 0.1 s later: one run each second after
    heights.changes = [(100.0, 7), (100.1, 8), (101.1, 9), (102.0, 10), (103.1, 11)]
    assert heights.doubled() == 0
    assert heights.intervals() == pytest.approx([1.0, 0.9, 1.1])
    heights.changes += [(103.3, 12), (104.3, 14)]  # two runs 0.2 s apart, then a count moving by 2
    assert heights.doubled() == 2


def test_only_haproxys_502_for_a_request_on_a_killed_app_host_is_spared_by_the_lab_simulation():
    from harness.chaos.records import Answer
    from harness.simulation.lab import judge_answers

    kills = [(10.0, 10.2)]  # the kill began at 10.0, its last SIGKILL at 10.2
    answers = [
        Answer("universal", "s28-u48", "c2", 9.9, 10.4, 502),  # in flight at the kill: HAProxy's page
        Answer("transfer", "s28-t1", "c1", 9.0, 9.1, 200),
        Answer("convert", "cycle-1", "cycler", 10.1, 10.3, 502),  # sent while the pids were being killed
    ]
    check = judge_answers(answers, kills, 0.0)
    assert check.ok, check.detail
    assert "in flight on an app host killed (+10.00 s): {502/None: 2}" in check.detail
    answers += [
        Answer("transfer", "s28-t2", "c1", 12.0, 12.1, 502),  # after the kill: not spared
        Answer("transfer", "s28-t3", "c1", 9.9, 10.4, 500, code=-1000),  # the service's own 500: never
    ]
    check = judge_answers(answers, kills, 0.0)
    assert not check.ok
    broken = check.detail.split("BREAKING THE RULES")[1]
    assert "s28-t2" in broken
    assert "s28-t3" in broken
    assert "s28-u48" not in broken


def test_the_app_hosts_configuration_is_the_one_start_writes_with_every_program_restarted():
    env = apphosts.app_env({"DATABASE_URL": "postgres://u:p@h/db", "REDIS_URL": "redis://h/0"})
    with tempfile.TemporaryDirectory(prefix="apps-") as run_dir:
        sup = apphosts.AppSupervisor([p for h in APP_HOSTS for p in apphosts.host_programs(h, env)], env, Path(run_dir))
        text = sup.configuration()  # what start() writes (cluster.LabSupervisor.configuration)
    sections = {block.split("]")[0]: block for block in text.split("\n[")}
    for host in APP_HOSTS:
        for name in apphosts.PROGRAMS:
            assert "autorestart=true" in sections[f"program:{name}-{host.name}"], name
        assert "autostart=false" in sections[f"program:beat-{host.name}"]


def test_haproxy_configuration_gives_a_slow_ping_longer_than_libpq_may_wait():
    """During a PostgreSQL failover the hosts' pings took > 1 s, HAProxy marked both down and answered
    its own 503 and 502 (a ping slower than 2 s kept UP, for real: tests/stack/test_lab_haproxy.py)."""
    cfg = apphosts.haproxy_cfg(18000, APP_HOSTS)
    assert f"timeout check {apphosts.CHECK_TIMEOUT_SECONDS}s" in cfg
    # above what libpq may spend on the lab's three hosts (connect_timeout=2 each)
    assert apphosts.CHECK_TIMEOUT_SECONDS > 3 * 2
    assert "connect_timeout=2" in topology.database_url()
    rest, ws = cfg.split("\nbackend rest\n")[1].split("\nbackend ws\n")
    assert "shutdown-sessions" not in rest  # a REST request in flight finishes
    assert ws.count("on-marked-down shutdown-sessions") == len(APP_HOSTS)
