"""A real streaming replica of the test run's PostgreSQL, for the tests of reads on a replica
(tests/exchange/test_replicas.py): `pg_basebackup -R` of the test server into a temporary directory,
then that server's own `postgres` binary on a free port as a hot standby. The test role needs the
REPLICATION attribute (scripts/services.sh gives it); the cluster's other databases come along, so
the copy takes seconds on a busy shared server (one per test module that asks for it).

Run as root (the project's machines), the standby runs as user postgres: PostgreSQL refuses root."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

# What a hot standby must have at least as much of as its primary, or it refuses to start.
_AT_LEAST_THE_PRIMARYS = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


@dataclass
class Replica:
    host: str
    port: int
    directory: Path
    process: subprocess.Popen
    conninfo: dict  # user, password, dbname: the test database on the standby
    superuser: str  # the cluster's own superuser, through the standby's private socket only

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(host=self.host, port=self.port, autocommit=True, **self.conninfo)

    def connect_as_superuser(self) -> psycopg.Connection:
        """For pg_wal_replay_pause() and _resume(), which are the superuser's (and cannot be granted
        on a standby)."""
        return psycopg.connect(
            host=str(self.directory.parent),
            port=self.port,
            user=self.superuser,
            dbname=self.conninfo["dbname"],
            autocommit=True,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def start(self) -> None:
        """Start it again after stop() (the same data directory)."""
        self.process = _start_postgres(self.directory)
        _wait_ready(self)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_postgres_user() -> list[str]:
    """The command prefix that runs a server program as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def _bin_dir(primary: psycopg.Connection) -> Path:
    major = int(primary.execute("SHOW server_version_num").fetchone()[0]) // 10000
    debian = Path(f"/usr/lib/postgresql/{major}/bin")
    if (debian / "postgres").exists():
        return debian
    found = shutil.which("postgres")
    if not found:
        raise RuntimeError("no postgres binary found for the replica")
    return Path(found).parent


def _start_postgres(directory: Path) -> subprocess.Popen:
    log = (directory.parent / "replica.log").open("ab")
    return subprocess.Popen(  # noqa: S603 - our own arguments
        [*_as_postgres_user(), str(directory.parent / "bin" / "postgres"), "-D", str(directory)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_ready(replica: Replica, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if replica.process.poll() is not None:
            log = (replica.directory.parent / "replica.log").read_text(errors="replace")
            raise RuntimeError(f"the replica exited ({replica.process.returncode}):\n{log[-3000:]}")
        try:
            with replica.connect() as conn:
                if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                    return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def start_replica(*, host: str, port: int, user: str, password: str, dbname: str) -> Replica:
    """A hot standby of the server at host:port, streaming from it, serving `dbname` read-only."""
    with psycopg.connect(host=host, port=port, user=user, password=password, dbname=dbname) as primary:
        bin_dir = _bin_dir(primary)
        superuser = primary.execute("SELECT rolname FROM pg_roles WHERE oid = 10").fetchone()[0]
        floor = {
            name: primary.execute("SELECT setting FROM pg_settings WHERE name = %s", [name]).fetchone()[0]
            for name in _AT_LEAST_THE_PRIMARYS
        }
    # Not under pytest's tmp_path: its directories are private to the test's user, and the standby
    # may run as another.
    base = Path(tempfile.mkdtemp(prefix="exchange-replica-"))
    directory = base / "data"
    (base / "bin").symlink_to(bin_dir)
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        os.chown(base, postgres.pw_uid, postgres.pw_gid)
    base.chmod(0o700)
    env = {**os.environ, "PGPASSWORD": password}
    try:
        subprocess.run(  # noqa: S603 - our own arguments
            [
                *_as_postgres_user(),
                str(bin_dir / "pg_basebackup"),
                f"--host={host}",
                f"--port={port}",
                f"--username={user}",
                f"--pgdata={directory}",
                "--write-recovery-conf",  # standby.signal and primary_conninfo
                "--wal-method=stream",
                "--checkpoint=fast",  # not wait for the next spread checkpoint
                "--no-sync",  # a throwaway copy
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"pg_basebackup failed: {exc.stderr.decode(errors='replace')}") from exc
    standby_port = _free_port()
    # Debian keeps postgresql.conf and pg_hba.conf outside the data directory: the copy has neither.
    (directory / "postgresql.conf").write_text(
        "\n".join(
            [
                "listen_addresses = '127.0.0.1'",
                f"port = {standby_port}",
                f"unix_socket_directories = '{base}'",
                "hot_standby = on",
                "hot_standby_feedback = on",
                "fsync = off",
                "logging_collector = off",
                *(f"{name} = {value}" for name, value in floor.items()),
                "",
            ]
        )
    )
    # The socket's directory is the standby's user's alone (0700): only that user (or root) reaches
    # the superuser's line.
    (directory / "pg_hba.conf").write_text(f"local all {superuser} trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    (directory / "pg_ident.conf").write_text("")
    if os.geteuid() == 0:
        for path in (directory / "postgresql.conf", directory / "pg_hba.conf", directory / "pg_ident.conf"):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
    replica = Replica(
        host="127.0.0.1",
        port=standby_port,
        directory=directory,
        process=_start_postgres(directory),
        conninfo={"user": user, "password": password, "dbname": dbname},
        superuser=superuser,
    )
    try:
        _wait_ready(replica)
    except BaseException:
        replica.remove()
        shutil.rmtree(base, ignore_errors=True)
        raise
    return replica


def remove_replica(replica: Replica) -> None:
    replica.stop()
    with contextlib.suppress(OSError):
        shutil.rmtree(replica.directory.parent)
