"""The lab's hosts and addresses (10.77.0.0/24 is the lab's own; nothing else routes to it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "xlab0"
GATEWAY = "10.77.0.1"  # the bridge's address: the application, in the machine's own namespace
# HAProxy's own source address towards the app hosts (a second address of the bridge, which nothing
# else uses: the kernel picks GATEWAY for every other connection). The app hosts believe
# X-Forwarded-For from this address only, so no other process of the machine's namespace that
# reaches an app host directly can claim a client's address.
PROXY_ADDRESS = "10.77.0.2"
PREFIX = 24
SCOPE = "exchange-lab"  # Patroni's cluster name
MASTER = "mymaster"  # Sentinel's name for the Redis primary
PG_PORT = 5432
PATRONI_PORT = 8008
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
REDIS_PORT = 6379
SENTINEL_PORT = 26379
PG_PASSWORD = "lab"  # noqa: S105 - a throwaway lab on an address range of its own
# Redis's `requirepass` (and the replicas' `masterauth`, the sentinels' `auth-pass`), and the
# sentinels' own `requirepass`: a sentinel that answers anyone could be told to fail over or to
# monitor another server (SENTINEL SET, SENTINEL FAILOVER). Two passwords, to show each goes only where it belongs.
REDIS_PASSWORD = "lab-redis"  # noqa: S105 - as PG_PASSWORD
SENTINEL_PASSWORD = "lab-sentinel"  # noqa: S105 - as PG_PASSWORD
DATABASE = "exchange"
# The application's own role (created at bootstrap, config.post_bootstrap_sql): LOGIN and CREATEDB only,
# the owner of the application's database; `postgres` (the superuser) is Patroni's alone.
APP_USER = "exchange"
APP_PASSWORD = "lab"  # noqa: S105 - as PG_PASSWORD
PG_BIN = Path(os.environ.get("LAB_PG_BIN", "/usr/lib/postgresql/15/bin"))
LAB_DIR = Path(os.environ.get("LAB_DIR", "/tmp/exchange-lab"))  # noqa: S108 - root's lab, user postgres must reach it
# Patroni from PyPI, pinned, in a virtualenv of its own (not the project's requirements: only the lab's
# nodes run it), outside the work tree so that user postgres reaches it wherever the clone is, and
# named by its version so that `down` keeps it and a new pin installs beside it (cluster.ensure_patroni).
PATRONI_VERSION = "3.1.2"
PATRONI_PSYCOPG = "psycopg[binary]==3.3.9"  # its driver: the project's pin (3.1 has no psycopg3 extra)
PATRONI_VENV = Path(os.environ.get("LAB_PATRONI_VENV", f"/opt/exchange-lab/patroni-{PATRONI_VERSION}"))


@dataclass(frozen=True)
class Host:
    name: str
    address: str

    @property
    def netns(self) -> str:
        return f"xlab-{self.name}"

    @property
    def veth(self) -> str:
        return f"vx-{self.name}"  # the root namespace's end (at most 15 characters)

    @property
    def dir(self) -> Path:
        return LAB_DIR / self.name


DB_HOSTS = [Host(f"db{i}", f"10.77.0.1{i}") for i in (1, 2, 3)]
REDIS_HOSTS = [Host(f"redis{i}", f"10.77.0.2{i}") for i in (1, 2, 3)]
# The application hosts (harness/lab/apphosts.py): granian, Daphne, a Celery worker and a
# beat each, on these ports of their own address; HAProxy in the machine's namespace in front.
APP_HOSTS = [Host(f"app{i}", f"10.77.0.3{i}") for i in (1, 2)]
APP_REST_PORT = 8001
APP_WS_PORT = 8002
HOSTS = DB_HOSTS + REDIS_HOSTS + APP_HOSTS


# A host cut off answers nothing (no RST): without these a request on a connection to it waits for
# the kernel's TCP timeouts (minutes); with them it fails within ~5 s with -1001 (OperationalError).
# connect_timeout: per host tried; tcp_user_timeout (ms): data sent and not acknowledged;
# keepalives: a connection idle while it waits for an answer (a commit waiting on a dead primary).
LIBPQ_OPTIONS = (
    "target_session_attrs=read-write&connect_timeout=2"
    "&keepalives=1&keepalives_idle=2&keepalives_interval=1&keepalives_count=2&tcp_user_timeout=5000"
)


def database_url() -> str:
    """libpq's multi-host form: psycopg tries each and keeps the one that accepts writes."""
    hosts = ",".join(f"{h.address}:{PG_PORT}" for h in DB_HOSTS)
    return f"postgres://{APP_USER}:{APP_PASSWORD}@{hosts}/{DATABASE}?{LIBPQ_OPTIONS}"


def maintenance_url(host: Host) -> str:
    """The application's role on one node's `postgres` database: where it drops and creates its own."""
    return f"postgres://{APP_USER}:{APP_PASSWORD}@{host.address}:{PG_PORT}/postgres?connect_timeout=2"


def sentinels() -> str:
    return ",".join(f"{h.address}:{SENTINEL_PORT}" for h in REDIS_HOSTS)


def app_env(redis_db: int = 0) -> dict[str, str]:
    """What the application needs to find the lab's primaries by itself."""
    return {
        "DATABASE_URL": database_url(),
        "REDIS_SENTINELS": sentinels(),
        "REDIS_SENTINEL_MASTER": MASTER,
        "REDIS_URL": f"redis://:{REDIS_PASSWORD}@{MASTER}/{redis_db}",
        "REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
    }


# The lab's own Redis clients (its checks and faults), with the passwords.
def redis_at(host: Host, **kwargs):
    """A client of the Redis server on `host` itself (whatever its role)."""
    import redis

    return redis.Redis(host=host.address, port=REDIS_PORT, password=REDIS_PASSWORD, **kwargs)


def sentinel_at(host: Host, **kwargs):
    """A client of the sentinel on `host` (SENTINEL commands)."""
    import redis

    return redis.Redis(host=host.address, port=SENTINEL_PORT, password=SENTINEL_PASSWORD, **kwargs)


def redis_primary(db: int, timeout: float = 2.0):
    """A client of the primary the sentinels name, database `db`."""
    from redis.sentinel import Sentinel

    hosts = [(h.address, SENTINEL_PORT) for h in REDIS_HOSTS]
    sentinel = Sentinel(hosts, socket_timeout=timeout, sentinel_kwargs={"password": SENTINEL_PASSWORD})
    return sentinel.master_for(MASTER, db=db, socket_timeout=timeout, password=REDIS_PASSWORD)
