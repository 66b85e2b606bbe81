"""Redis with a password behind a Sentinel with a password of its own (docs/scaling.md, the lab's
configuration): every client the application makes (the redis-py factory, the channel layer and
streams/fanout.py's synchronous pool over it, Celery's broker, the rate limits' storage, RedBeat)
reaches the primary through the sentinel with the right password for each, and is refused with
either one missing. Real processes: a redis-server with `requirepass` and a sentinel with its own
`requirepass` and `auth-pass` to the server, on free ports. The settings are read in a fresh
interpreter with the environment under test (they are read once per process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from harness.ports import HOST, free_port, wait_for_port

REDIS_PASSWORD = "redis-pw"  # a test server on a free port
SENTINEL_PASSWORD = "sentinel-pw"
MASTER = "probe-master"
CLIENTS = ["redis_py", "channel_layer", "fanout_pool", "celery_broker", "limits", "redbeat"]

# One operation with each client, each result "ok" or the exception's class.
_PROBE = """
import asyncio, json
import django
django.setup()
from django.conf import settings

done = {}

def attempt(name, operation):
    try:
        operation()
        done[name] = "ok"
    except Exception as exc:  # the answer is the class of the refusal
        done[name] = type(exc).__name__

def redis_py():
    from exchange.runtime import redis_clients
    client = redis_clients.client(socket_timeout=2)
    client.set("auth-probe", "1")
    assert client.get("auth-probe") == b"1"

def channel_layer():
    from channels.layers import get_channel_layer
    async def both():
        layer = get_channel_layer()
        await layer.send("auth-probe", {"type": "probe"})
        assert (await layer.receive("auth-probe"))["type"] == "probe"
    asyncio.run(asyncio.wait_for(both(), 10))

def fanout_pool():
    import redis
    from streams.fanout import _sync_pool
    host = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]
    assert redis.Redis(connection_pool=_sync_pool(host)).ping()

def celery_broker():
    from exchange.celery import app
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        queue = conn.SimpleQueue("auth-probe-queue")
        queue.put({"probe": 1})
        message = queue.get(timeout=5)
        message.ack()
        assert message.payload == {"probe": 1}
        queue.close()

def limits():
    from exchange.api.ratelimit.storage import _storage_for
    assert _storage_for(settings.RATE_LIMIT_STORAGE_URL).incr("auth-probe-limit", 60) >= 1

def redbeat():
    from redbeat.schedulers import get_redis
    from exchange.celery import app
    get_redis(app).set("auth-probe-beat", "1")

# Side by side: a refused client may retry for seconds (RedBeat, kombu) before it gives up.
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(len(CLIENTS)) as pool:
    for name in CLIENTS:
        pool.submit(attempt, name, globals()[name])
print(json.dumps(done))
""".replace("CLIENTS", repr(CLIENTS))


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    """A redis-server with requirepass and a sentinel with its own requirepass watching it."""
    base = tmp_path_factory.mktemp("sentinel-auth")
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    redis_port, sentinel_port = free_port(), free_port()
    (base / "redis.conf").write_text(
        f'bind {HOST}\nport {redis_port}\ndir {base}\nsave ""\nappendonly no\n'
        f"requirepass {REDIS_PASSWORD}\nmasterauth {REDIS_PASSWORD}\n"
    )
    (base / "sentinel.conf").write_text(  # sentinel rewrites it: a file of its own
        f"bind {HOST}\nport {sentinel_port}\ndir {base}\n"
        f"sentinel monitor {MASTER} {HOST} {redis_port} 1\n"
        f"sentinel auth-pass {MASTER} {REDIS_PASSWORD}\n"
        f"requirepass {SENTINEL_PASSWORD}\n"
    )
    procs = []
    try:
        servers = [(base / "redis.conf", redis_port, []), (base / "sentinel.conf", sentinel_port, ["--sentinel"])]
        for conf, port, extra in servers:
            log = open(base / f"{port}.log", "wb")  # noqa: SIM115 - the process's log for its life
            procs.append(subprocess.Popen([server, str(conf), *extra], stdout=log, stderr=subprocess.STDOUT))  # noqa: S603
            wait_for_port(port, timeout=20, proc=procs[-1], log=str(base / f"{port}.log"))
        yield f"{HOST}:{sentinel_port}"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def _probe(sentinel: str, redis_url: str, sentinel_password: str) -> dict:
    cleared = ("DATABASE_URL", "REDIS_URL", "RATE_LIMIT_STORAGE_URL", "CELERY_BROKER_URL", "REDIS_SENTINEL_PASSWORD")
    clean = {k: v for k, v in os.environ.items() if k not in cleared and not k.startswith("DJANGO_")}
    env = clean | {
        "DJANGO_SETTINGS_MODULE": "exchange.settings.base",
        "REDIS_SENTINELS": sentinel,
        "REDIS_SENTINEL_MASTER": MASTER,
        "REDIS_URL": redis_url,
        "REDIS_SENTINEL_PASSWORD": sentinel_password,
        "CELERY_BEAT_SCHEDULER": "redbeat.RedBeatScheduler",
        "REDBEAT_LOCK_TIMEOUT_SECONDS": "10",
    }
    done = subprocess.run(  # noqa: S603 - this interpreter on our own settings
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# The four configurations, probed side by side (each refused client retries for seconds before it
# gives up: one after the other took ~45 s); only "both" can write, into its own keys.
CASES = {
    "both": (f"redis://:{REDIS_PASSWORD}@{MASTER}/3", SENTINEL_PASSWORD),
    "no_redis_password": (f"redis://{MASTER}/3", SENTINEL_PASSWORD),
    "no_sentinel_password": (f"redis://:{REDIS_PASSWORD}@{MASTER}/3", ""),
    # What a client that sends REDIS_URL's password to the sentinels would meet here.
    "redis_password_to_sentinel": (f"redis://:{REDIS_PASSWORD}@{MASTER}/3", REDIS_PASSWORD),
}


@pytest.fixture(scope="module")
def probed(sentinel) -> dict[str, Future]:
    with ThreadPoolExecutor(len(CASES)) as pool:
        return {name: pool.submit(_probe, sentinel, *case) for name, case in CASES.items()}


def test_every_client_reaches_the_primary_with_both_passwords(probed):
    # Two different passwords: a client that gave the sentinel Redis's (limits' default) would be refused.
    assert probed["both"].result() == dict.fromkeys(CLIENTS, "ok")


@pytest.mark.parametrize("case", ["no_redis_password", "no_sentinel_password", "redis_password_to_sentinel"])
def test_every_client_is_refused(probed, case):
    done = probed[case].result()
    assert all(result != "ok" for result in done.values()), done
    assert set(done) == set(CLIENTS)
