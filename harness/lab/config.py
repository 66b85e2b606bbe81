"""What each lab host runs: the command lines and configuration files (written at every `up`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.lab.topology import (
    APP_PASSWORD,
    APP_USER,
    DATABASE,
    DB_HOSTS,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    MASTER,
    PATRONI_PORT,
    PATRONI_VENV,
    PG_BIN,
    PG_PASSWORD,
    PG_PORT,
    REDIS_HOSTS,
    REDIS_PASSWORD,
    REDIS_PORT,
    SCOPE,
    SENTINEL_PASSWORD,
    SENTINEL_PORT,
    Host,
)

# Debian's Python: user postgres runs it (a Python under /root, pyenv's, is not theirs to run).
SYSTEM_PYTHON = "/usr/bin/python3"
# Patroni's start on a db host (etcd_wait.py); cluster.write_files copies it into the host's directory.
ETCD_WAIT = Path(__file__).with_name("etcd_wait.py")

# Patroni's timing (ttl >= loop_wait + 2 * retry_timeout): a leader that stops renewing its key is
# replaced after at most `ttl` seconds.
TTL = 10
LOOP_WAIT = 1
RETRY_TIMEOUT = 4
# Sentinel: a primary that does not answer for this long is down; a quorum of 2 of 3 fails it over.
SENTINEL_DOWN_MS = 2000
SENTINEL_QUORUM = 2


def etcd_args(host: Host) -> list[str]:
    cluster = ",".join(f"e{h.name}=http://{h.address}:{ETCD_PEER_PORT}" for h in DB_HOSTS)
    return [
        shutil.which("etcd") or "/usr/bin/etcd",
        "--name",
        f"e{host.name}",
        "--data-dir",
        str(host.dir / "etcd"),
        "--listen-client-urls",
        f"http://{host.address}:{ETCD_CLIENT_PORT},http://127.0.0.1:{ETCD_CLIENT_PORT}",
        "--advertise-client-urls",
        f"http://{host.address}:{ETCD_CLIENT_PORT}",
        "--listen-peer-urls",
        f"http://{host.address}:{ETCD_PEER_PORT}",
        "--initial-advertise-peer-urls",
        f"http://{host.address}:{ETCD_PEER_PORT}",
        "--initial-cluster",
        cluster,
        "--initial-cluster-token",
        SCOPE,
        "--initial-cluster-state",
        "new",
        # info: raft's elections and terms, what a partition's healing is read from
        # A member cut off from the others campaigns alone and reaches a higher raft term; without
        # pre-vote, when its link comes back that term deposes the elected etcd leader, every Patroni
        # loses etcd for a few seconds and the primary demotes itself (issue 28's pg-cut). With it, a
        # member campaigns only after a majority says it would vote for it: the rejoining member
        # catches up as a follower. (etcd 3.5 makes it the default.)
        "--pre-vote",
        "--log-level",
        "info",
    ]


def patroni_args(host: Host) -> list[str]:
    first = next(h for h in DB_HOSTS if h != host)
    version = f"http://{first.address}:{ETCD_CLIENT_PORT}/version"
    # Patroni waits for etcd's decided cluster version first (etcd_wait.py says why), run by Debian's
    # Python from the copy cluster.write_files puts in the host's directory (user postgres runs it).
    wait = [SYSTEM_PYTHON, str(host.dir / ETCD_WAIT.name), version]
    return [*wait, str(PATRONI_VENV / "bin" / "patroni"), str(host.dir / "patroni.yml")]


def post_bootstrap_sql() -> str:
    """The application's role and database, run once by Patroni on the new cluster's first primary.
    CREATEDB is the one right beyond LOGIN: each fault run drops and creates its fresh database
    (fault.fresh); owning the database gives it its schema (PostgreSQL 15: `public` belongs to the
    database's owner). No SUPERUSER, CREATEROLE or REPLICATION: a compromised application cannot
    read other databases' files, make roles or stream the WAL."""
    return (
        f"CREATE ROLE {APP_USER} LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION PASSWORD '{APP_PASSWORD}';\n"
        f"CREATE DATABASE {DATABASE} OWNER {APP_USER};\n"
    )


def post_bootstrap_script() -> str:
    """Patroni runs it as user postgres with a superuser connection string as its argument; a failure
    fails the bootstrap (the cluster is not ready, `up` says so)."""
    psql = PG_BIN / "psql"
    return f"#!/bin/sh\nset -e\nexec {psql} \"$1\" -v ON_ERROR_STOP=1 -q <<'SQL'\n{post_bootstrap_sql()}SQL\n"


def patroni_yml(host: Host) -> str:
    """Patroni 4.0 (PyPI, topology.PATRONI_VERSION) on etcd's v3 API; JSON is YAML, and needs no YAML writer."""
    conf = {
        "scope": SCOPE,
        "name": host.name,
        # INFO: each loop's decision (who takes the leader key, and why), what a fault is read from
        "log": {"level": "INFO"},
        "restapi": {"listen": f"{host.address}:{PATRONI_PORT}", "connect_address": f"{host.address}:{PATRONI_PORT}"},
        # Only the OTHER hosts' etcd members, and only those (use_proxies: no discovery of the member
        # list, which would bring the own host's member back). Patroni 3.0.2 reads etcd with
        # serializable (non-quorum) reads, and its update_leader() writes the leader key
        # unconditionally when its (stale) view says it holds it (fixed in Patroni 3.0.3, pull
        # request patroni#2689): a primary cut off from the others still read its own host's member,
        # which kept showing it as the leader; when the link came back, that write overwrote the new
        # leader's key and the old primary, without the new one's commits, was promoted again (the
        # acknowledged writes lost in issue 28's pg-cut). Cut off from the others' members, a cut-off
        # node sees no DCS at all (it demotes, and reads the true leader when its link is back).
        "etcd3": {"hosts": [f"{h.address}:{ETCD_CLIENT_PORT}" for h in DB_HOSTS if h != host], "use_proxies": True},
        "bootstrap": {
            "dcs": {
                "ttl": TTL,
                "loop_wait": LOOP_WAIT,
                "retry_timeout": RETRY_TIMEOUT,
                "maximum_lag_on_failover": 1024 * 1024,
                # A replica on another timeline than the cluster's (a former primary not yet rewound)
                # never takes part in the leader race.
                "check_timeline": True,
                # A commit is acknowledged once a second node has it (synchronous_standby_names
                # set by Patroni); only that node may be promoted.
                "synchronous_mode": True,
                # Strict: with no synchronous standby the primary blocks commits instead of going on
                # alone (non-strict, a newly promoted primary takes writes asynchronously until a
                # standby follows it: acknowledged writes on one machine only). With three nodes one
                # may be away and writes still go on.
                "synchronous_mode_strict": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {
                        "max_connections": 300,
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"],
            # The application's own role and database (Patroni 4 has no `bootstrap.users`).
            "post_bootstrap": str(host.dir / "post_bootstrap.sh"),
            "pg_hba": [
                "local all all trust",
                "host replication replicator 10.77.0.0/24 md5",
                "host all all 10.77.0.0/24 md5",
                "host all all 127.0.0.1/32 md5",
            ],
        },
        "postgresql": {
            "listen": f"{host.address},127.0.0.1:{PG_PORT}",
            "connect_address": f"{host.address}:{PG_PORT}",
            "data_dir": str(host.dir / "data"),
            "bin_dir": str(PG_BIN),
            "pgpass": str(host.dir / "pgpass"),
            # A new replica (`up`, pg-disk's rebuild) copies the leader at once: pg_basebackup's default
            # spread checkpoint waits most of checkpoint_timeout (4.5 of 5 min) on an idle leader.
            "basebackup": [{"checkpoint": "fast"}],
            "authentication": {
                "superuser": {"username": "postgres", "password": PG_PASSWORD},
                "replication": {"username": "replicator", "password": PG_PASSWORD},
            },
            "parameters": {"unix_socket_directories": str(host.dir)},
        },
    }
    return json.dumps(conf, indent=2) + "\n"


def redis_conf(host: Host) -> str:
    lines = [
        f"bind {host.address} 127.0.0.1",
        f"port {REDIS_PORT}",
        "protected-mode no",
        f"dir {host.dir}",
        'save ""',
        "appendonly no",
        "replica-read-only yes",
        # Every server, replicas too: any may become the primary; masterauth for replicating from it.
        f"requirepass {REDIS_PASSWORD}",
        f"masterauth {REDIS_PASSWORD}",
    ]
    if host != REDIS_HOSTS[0]:
        lines.append(f"replicaof {REDIS_HOSTS[0].address} {REDIS_PORT}")
    return "\n".join(lines) + "\n"


def sentinel_conf(host: Host) -> str:
    """Sentinel rewrites its own file (what it learnt): written anew at every `up`."""
    return (
        "\n".join(
            [
                f"bind {host.address} 127.0.0.1",
                f"port {SENTINEL_PORT}",
                "protected-mode no",
                f"dir {host.dir}",
                f"sentinel announce-ip {host.address}",
                f"sentinel monitor {MASTER} {REDIS_HOSTS[0].address} {REDIS_PORT} {SENTINEL_QUORUM}",
                f"sentinel down-after-milliseconds {MASTER} {SENTINEL_DOWN_MS}",
                f"sentinel failover-timeout {MASTER} 10000",
                f"sentinel parallel-syncs {MASTER} 1",
                f"sentinel auth-pass {MASTER} {REDIS_PASSWORD}",  # to Redis (INFO, REPLICAOF, ...)
                f"requirepass {SENTINEL_PASSWORD}",  # its clients and the other sentinels
                f"sentinel sentinel-pass {SENTINEL_PASSWORD}",  # to the other sentinels
            ]
        )
        + "\n"
    )
