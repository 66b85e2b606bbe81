"""Settings for a highly available deployment (docs/scaling.md): a libpq multi-host DATABASE_URL and
Redis through Sentinel for every client; without them, everything as before. The settings module
is read in a fresh interpreter with the environment under test (settings are read once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings
from django.test import override_settings
from redis.sentinel import SentinelConnectionPool

from exchange.runtime import redis_clients

_DUMP = """
import json
from exchange.settings import base as s
print(json.dumps({name: getattr(s, name, None) for name in (
    "DATABASES", "REDIS_URL", "RATE_LIMIT_STORAGE_URL", "CELERY_BROKER_URL", "CELERY_BROKER_TRANSPORT_OPTIONS",
    "CHANNEL_LAYERS", "REDIS_SENTINELS", "REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_KWARGS",
    "CELERY_REDBEAT_REDIS_OPTIONS")}, default=str))
"""
_CLEARED = ("DATABASE_URL", "REDIS_URL", "REDIS_SENTINELS", "REDIS_SENTINEL_MASTER", "RATE_LIMIT_STORAGE_URL")
_CLEARED += ("CELERY_BROKER_URL", "REDIS_SENTINEL_PASSWORD", "CELERY_BEAT_SCHEDULER")


def _settings(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in _CLEARED and not k.startswith("DJANGO_")}
    done = subprocess.run(  # noqa: S603 - this interpreter on our own settings
        [sys.executable, "-c", _DUMP], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_multi_host_database_url_reaches_libpq_with_every_host():
    url = "postgres://u:p@10.77.0.11:5432,10.77.0.12:5432,10.77.0.13:5432/exchange?target_session_attrs=read-write"
    db = _settings(DATABASE_URL=url)["DATABASES"]["default"]
    assert db["ENGINE"] == "django.db.backends.postgresql"
    # Django hands HOST and PORT to psycopg as libpq's host= and port= lists: it tries each in turn
    # and keeps the one that accepts writes.
    assert db["HOST"] == "10.77.0.11,10.77.0.12,10.77.0.13"
    assert db["PORT"] == "5432,5432,5432"
    assert db["NAME"] == "exchange"
    assert db["OPTIONS"]["target_session_attrs"] == "read-write"
    assert db["OPTIONS"]["pool"]["max_size"] == 8  # the pool and prepared statements as for one host
    assert db["OPTIONS"]["prepare_threshold"] == 5


def test_without_sentinels_every_redis_client_uses_redis_url():
    s = _settings(DATABASE_URL="postgres://u:p@h:5432/db", REDIS_URL="redis://127.0.0.1:6379/3")
    assert s["REDIS_SENTINELS"] == []
    assert s["RATE_LIMIT_STORAGE_URL"] == "redis://127.0.0.1:6379/3"
    assert s["CELERY_BROKER_URL"] == "redis://127.0.0.1:6379/3"
    assert s["CELERY_BROKER_TRANSPORT_OPTIONS"] is None
    host = s["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"]
    assert host == [{"address": "redis://127.0.0.1:6379/3", "socket_timeout": 15, "max_connections": 1000}]


def test_embedded_default_unchanged():
    s = _settings()
    assert s["REDIS_URL"] == ""
    assert s["RATE_LIMIT_STORAGE_URL"] == "memory://"
    assert s["CELERY_BROKER_URL"] == "memory://"
    assert s["CHANNEL_LAYERS"]["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer"
    assert s["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"


def test_sentinels_configure_broker_channel_layer_and_limits():
    s = _settings(REDIS_SENTINELS="10.77.0.21:26379,10.77.0.22:26379,10.77.0.23:26379", REDIS_URL="redis://ha/2")
    sentinels = [["10.77.0.21", 26379], ["10.77.0.22", 26379], ["10.77.0.23", 26379]]
    assert s["REDIS_SENTINELS"] == sentinels
    assert s["REDIS_SENTINEL_MASTER"] == "mymaster"
    assert s["RATE_LIMIT_STORAGE_URL"] == "redis+sentinel://10.77.0.21:26379,10.77.0.22:26379,10.77.0.23:26379/mymaster"
    assert s["CELERY_BROKER_URL"] == (
        "sentinel://10.77.0.21:26379/2;sentinel://10.77.0.22:26379/2;sentinel://10.77.0.23:26379/2"
    )
    assert s["CELERY_BROKER_TRANSPORT_OPTIONS"]["master_name"] == "mymaster"
    host = s["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"][0]
    assert host["sentinels"] == sentinels
    assert host["master_name"] == "mymaster"
    assert host["db"] == 2
    assert "address" not in host


def test_each_password_goes_where_it_belongs():
    """Redis's (REDIS_URL's) to every client's Redis connections, the sentinels' own to the sentinels
    only (tests/exchange/test_redis_sentinel_auth.py runs them against real servers)."""
    env = {"REDIS_SENTINELS": "10.77.0.21:26379,10.77.0.22:26379", "REDIS_URL": "redis://:p%40ss@ha/2"}
    env |= {"REDIS_SENTINEL_MASTER": "ha", "CELERY_BEAT_SCHEDULER": "redbeat.RedBeatScheduler"}
    s = _settings(**env, REDIS_SENTINEL_PASSWORD="sentinel")
    assert s["REDIS_SENTINEL_KWARGS"] == {"socket_timeout": 1.0, "socket_connect_timeout": 1.0, "password": "sentinel"}
    assert s["RATE_LIMIT_STORAGE_URL"] == "redis+sentinel://:p%40ss@10.77.0.21:26379,10.77.0.22:26379/ha"
    assert s["CELERY_BROKER_URL"] == "sentinel://:p%40ss@10.77.0.21:26379/2;sentinel://:p%40ss@10.77.0.22:26379/2"
    assert s["CELERY_BROKER_TRANSPORT_OPTIONS"]["sentinel_kwargs"] == s["REDIS_SENTINEL_KWARGS"]
    host = s["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"][0]
    assert (host["password"], host["sentinel_kwargs"]["password"]) == ("p@ss", "sentinel")
    beat = s["CELERY_REDBEAT_REDIS_OPTIONS"]
    assert (beat["password"], beat["sentinel_kwargs"]["password"]) == ("p@ss", "sentinel")
    # Sentinels without a password of their own: none sent to them (not Redis's either).
    assert _settings(**env)["REDIS_SENTINEL_KWARGS"]["password"] is None


def test_sentinels_without_redis_url_use_database_zero():
    s = _settings(REDIS_SENTINELS="10.77.0.21:26379", REDIS_SENTINEL_MASTER="ha")
    assert s["REDIS_URL"] == "redis://ha/0"
    assert s["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"][0]["db"] == 0
    assert s["CELERY_BROKER_URL"] == "sentinel://10.77.0.21:26379/0"


def test_client_factory_follows_settings():
    plain = redis_clients.client("redis://127.0.0.1:6379/4", socket_timeout=1)
    assert plain.connection_pool.connection_kwargs["db"] == 4
    assert not isinstance(plain.connection_pool, SentinelConnectionPool)
    with override_settings(REDIS_SENTINELS=[("10.77.0.21", 26379)], REDIS_SENTINEL_MASTER="ha"):
        # No connection is made until the first command: the sentinels are asked then.
        through = redis_clients.client("redis://:secret@ha/5", decode_responses=True, socket_timeout=1)
        assert isinstance(through.connection_pool, SentinelConnectionPool)
        assert through.connection_pool.service_name == "ha"
        kwargs = through.connection_pool.connection_kwargs
        assert (kwargs["db"], kwargs["password"], kwargs["decode_responses"]) == (5, "secret", True)
    assert redis_clients.sentinels() == list(settings.REDIS_SENTINELS)
