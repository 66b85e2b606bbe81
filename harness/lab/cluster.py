"""The lab under supervisord: every host's programs (etcd, Patroni with its PostgreSQL, Redis,
Sentinel), each inside its namespace; waiting for the primaries; asking who leads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness.lab import config, net
from harness.lab.topology import (
    APP_USER,
    DATABASE,
    DB_HOSTS,
    HOSTS,
    LAB_DIR,
    MASTER,
    PATRONI_PORT,
    PATRONI_PSYCOPG,
    PATRONI_VENV,
    PATRONI_VERSION,
    REDIS_HOSTS,
    REDIS_PASSWORD,
    REDIS_PORT,
    Host,
    database_url,
    maintenance_url,
    sentinel_at,
)
from harness.layout import ROOT
from harness.programs import Program
from harness.supervisor import Supervisor, supervisord_conf

RUN_DIR = LAB_DIR / "supervisor"


def programs() -> list[Program]:
    out = []
    for host in DB_HOSTS:
        out.append(Program(f"etcd-{host.name}", net.in_host(host, config.etcd_args(host))))
    for host in DB_HOSTS:
        out.append(Program(f"patroni-{host.name}", net.in_host(host, config.patroni_args(host), user="postgres")))
    for host in REDIS_HOSTS:
        redis = ["/usr/bin/redis-server", str(host.dir / "redis.conf")]
        out.append(Program(f"redis-{host.name}", net.in_host(host, redis)))
    for host in REDIS_HOSTS:
        sentinel = ["/usr/bin/redis-sentinel", str(host.dir / "sentinel.conf")]
        out.append(Program(f"sentinel-{host.name}", net.in_host(host, sentinel)))
    return out


class LabSupervisor(Supervisor):
    """supervisord as the stack's, except that a lab program that dies stays dead: a killed host is
    down until the fault brings it back (`start(name)`), as a machine would be."""

    def conf_text(self, text: str) -> str:
        return text

    def configuration(self) -> str:
        """The supervisord.conf `start` writes: the stack's, its programs not restarted, then `conf_text`."""
        text = supervisord_conf(self.programs, self.run_dir).replace(
            "autorestart=true\nstartsecs=1", "autorestart=false\nstartsecs=1"
        )
        return self.conf_text(text)

    def start(self, timeout: float = 120.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.configuration())
        out = (self.run_dir / "lab.log").open("ab")
        with out:
            self.proc = subprocess.Popen(  # noqa: S603 - supervisord on our own configuration
                [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # `up` returns; `down` stops it through its pid file
            )


def write_files() -> None:
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(LAB_DIR, 0o755)  # noqa: S103 - user postgres must reach its directories
    for host in HOSTS:
        host.dir.mkdir(parents=True, exist_ok=True)
    for host in DB_HOSTS:
        (host.dir / "patroni.yml").write_text(config.patroni_yml(host))
        shutil.copyfile(config.ETCD_WAIT, host.dir / config.ETCD_WAIT.name)  # Patroni's start (etcd_wait.py)
        script = host.dir / "post_bootstrap.sh"
        script.write_text(config.post_bootstrap_script())
        os.chmod(script, 0o755)  # noqa: S103 - Patroni (user postgres) runs it
        shutil.chown(host.dir, "postgres", "postgres")
        os.chmod(host.dir, 0o700)
    for host in REDIS_HOSTS:
        (host.dir / "redis.conf").write_text(config.redis_conf(host))
        (host.dir / "sentinel.conf").write_text(config.sentinel_conf(host))


def supervisor() -> LabSupervisor:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_"))}
    return LabSupervisor(programs(), env, RUN_DIR)


def _get(url: str, timeout: float = 1.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - the lab's own hosts
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return 0, {}


def pg_cluster() -> dict:
    """Patroni's view of the cluster (its REST API on any node that answers)."""
    for host in DB_HOSTS:
        status, body = _get(f"http://{host.address}:{PATRONI_PORT}/cluster")
        if status == 200:
            return body
    return {}


def pg_leader() -> Host | None:
    for member in pg_cluster().get("members", []):
        if member.get("role") == "leader" and member.get("state") == "running":
            return next(h for h in DB_HOSTS if h.name == member["name"])
    return None


def pg_sync_standby() -> str | None:
    return next((m["name"] for m in pg_cluster().get("members", []) if m.get("role") == "sync_standby"), None)


def redis_primary() -> str | None:
    import redis

    for host in REDIS_HOSTS:
        try:
            client = sentinel_at(host, socket_timeout=1, socket_connect_timeout=1)
            address = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
        except redis.RedisError:
            continue
        if address:
            return address[0].decode()
    return None


def wait_ready(timeout: float = 180.0) -> None:
    """A PostgreSQL leader with a synchronous standby, the application's database (made by the
    bootstrap: config.post_bootstrap_sql), a Redis primary known to the sentinels."""
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = pg_leader()
        if leader and pg_sync_standby() and redis_primary():
            try:
                psycopg.connect(database_url(), connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                pass  # the leader is up before its post_bootstrap has made the role and the database
        time.sleep(1)
    else:
        raise SystemExit(f"lab not ready after {timeout:.0f} s: {json.dumps(pg_cluster())}; redis {redis_primary()}")
    problems = app_role_problems()
    if problems:
        raise SystemExit(f"the lab's application role: {problems}")


def app_role_problems() -> list[str]:
    """What the application's role (DATABASE_URL's user) may do beyond LOGIN and CREATEDB: nothing, or
    the lab's runs would prove the service on rights production must not give it."""
    import psycopg

    with psycopg.connect(database_url(), connect_timeout=2) as conn:
        user, superuser, createrole, replication, bypassrls, owner = conn.execute(
            "SELECT current_user, rolsuper, rolcreaterole, rolreplication, rolbypassrls,"
            " pg_get_userbyid(d.datdba) FROM pg_roles r, pg_database d"
            " WHERE r.rolname = current_user AND d.datname = current_database()"
        ).fetchone()
    rights = {"SUPERUSER": superuser, "CREATEROLE": createrole, "REPLICATION": replication, "BYPASSRLS": bypassrls}
    problems = [f"{user} has {name}" for name, held in rights.items() if held]
    if user != APP_USER:
        problems.append(f"DATABASE_URL's user is {user}, not {APP_USER}")
    if owner != user:
        problems.append(f"the database {DATABASE} belongs to {owner}, not {user}")
    return problems


def recreate_database() -> None:
    """An empty application database on the primary, dropped and created by the application's role
    itself (its CREATEDB; it owns the old one, and FORCE ends its own sessions only)."""
    import psycopg

    leader = pg_leader()
    with psycopg.connect(maintenance_url(leader), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")


def healthy() -> bool:
    """Every node back: three Patroni members running on the leader's timeline with one synchronous
    standby, and a Redis primary with both replicas linked (what a fault starts from)."""
    members = pg_cluster().get("members", [])
    roles = sorted(m.get("role") for m in members if m.get("state") in ("running", "streaming"))
    if roles != ["leader", "replica", "sync_standby"] and roles != ["leader", "sync_standby", "sync_standby"]:
        return False
    primary = redis_primary()
    if primary is None:
        return False
    import redis

    try:
        info = redis.Redis(host=primary, port=REDIS_PORT, password=REDIS_PASSWORD, socket_timeout=1).info("replication")
    except redis.RedisError:
        return False
    return info.get("connected_slaves") == len(REDIS_HOSTS) - 1


def wait_healthy(timeout: float = 180.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy():
            return True
        time.sleep(1)
    return False


def ensure_patroni() -> Path:
    """The pinned Patroni in its own virtualenv (topology.PATRONI_VENV), installed from PyPI when
    missing: Debian bookworm's 3.0.2 has the leader key race of docs/scaling.md ("The pg-cut finding")."""
    patroni = PATRONI_VENV / "bin" / "patroni"
    stamp = PATRONI_VENV / ".installed"  # written last: a broken install is not taken for a good one
    if stamp.exists():
        return patroni
    shutil.rmtree(PATRONI_VENV, ignore_errors=True)
    PATRONI_VENV.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(PATRONI_VENV.parent, 0o755)  # noqa: S103 - user postgres runs it
    subprocess.run([config.SYSTEM_PYTHON, "-m", "venv", str(PATRONI_VENV)], check=True)  # noqa: S603 - our own paths
    pip = [str(PATRONI_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"patroni[etcd3]=={PATRONI_VERSION}", PATRONI_PSYCOPG], check=True)  # noqa: S603
    stamp.touch()
    return patroni


def up() -> None:
    if (RUN_DIR / "supervisord.pid").exists():
        raise SystemExit(f"the lab runs already ({RUN_DIR}); `python -m harness.lab down` first")
    ensure_patroni()
    net.up()
    write_files()
    supervisor().start()
    wait_ready()


def rpc():
    return supervisor().rpc()


def down() -> None:
    # The application's first: a fault run's stack (bank.LabRun.STACK_DIR) if one was cut short, the app hosts.
    for name in ("stack", "apps", "supervisor"):
        pid_file = LAB_DIR / name / "supervisord.pid"
        _stop(pid_file)
    net.down()
    shutil.rmtree(LAB_DIR, ignore_errors=True)


def _stop(pid_file: Path) -> None:
    if pid_file.exists():
        pid = int(pid_file.read_text().strip())
        try:
            os.kill(pid, 15)
            for _ in range(600):
                os.kill(pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            pass


def status() -> dict:
    return {
        "postgresql": [
            {k: m.get(k) for k in ("name", "host", "role", "state", "lag")} for m in pg_cluster().get("members", [])
        ],
        "redis_primary": redis_primary(),
    }


def log_path() -> Path:
    return RUN_DIR / "lab.log"
