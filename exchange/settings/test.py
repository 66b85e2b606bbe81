"""Test settings: the real PostgreSQL and Redis that `make test` starts (see Makefile)."""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import env

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; test users only
DATABASES = {"default": env.db("DATABASE_URL", default="postgres://exchange:exchange@127.0.0.1:5432/exchange")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"]["OPTIONS"] = {"prepare_threshold": 5}  # as in production (base.py)
# Separate names let several test runs share one PostgreSQL (set with a separate REDIS_URL database).
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="test_exchange")}
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/15")
# Parallel runs (pytest-xdist, `make test`): each worker flushes and counts in a Redis database of its
# own, the Nth of TEST_REDIS_DBS for worker gwN (the test database gets its _gwN suffix from
# pytest-django). A list, not an offset from REDIS_URL's number: a process a test starts inherits
# both variables and so lands in the same database as its test.
_worker = env.str("PYTEST_XDIST_WORKER", default="")
if _worker:
    _dbs = env.list("TEST_REDIS_DBS", default=[])
    _index = int(_worker.removeprefix("gw"))
    if _index >= len(_dbs):
        raise ImproperlyConfigured(
            f"pytest-xdist worker {_worker}: set TEST_REDIS_DBS to one Redis database number per worker"
        )
    REDIS_URL = f"{REDIS_URL.rsplit('/', 1)[0]}/{int(_dbs[_index])}"
RATE_LIMIT_STORAGE_URL = REDIS_URL
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ALWAYS_EAGER = True
# A slow consumer's channel holds up to STREAM_CHANNEL_CAPACITY messages; beyond that channels_redis
# drops them and the consumer's periodic catch-up reads the change feed instead.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py's 5 s socket timeout equals the layer's 5 s blocking read: quiet
            # connections would die; its pool of 100 refuses a reconnect storm.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 15, "max_connections": 1000}],
            "capacity": env.int("STREAM_CHANNEL_CAPACITY", default=5000),
        },
    }
}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
EMBEDDED_SCHEDULER = False
STREAM_SWEEPER_ENABLED = False  # tests that need it start it themselves
# In-process tests run on a busy machine and are not about the lag bound (tests that are set it):
# a test's event loop held up for a second must not cut its connections off (4006).
STREAM_MAX_LAG_SECONDS = 10.0
