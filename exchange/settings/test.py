"""Test settings: the real PostgreSQL and Redis that `make test` starts (see Makefile)."""

from django.core.exceptions import ImproperlyConfigured

from . import testnames
from .base import *  # noqa: F403
from .base import env

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; test users only
DATABASES = {"default": env.db("DATABASE_URL", default="postgres://exchange:exchange@127.0.0.1:5432/exchange")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
# prepare_threshold as in production (base.py). A test's statement that waits a minute for a lock, or
# runs for three, fails with PostgreSQL's error naming it instead of hanging the run until pytest-timeout
# (a lock held by a connection a test left open showed as a silent hang of a transactional test's flush).
DATABASES["default"]["OPTIONS"] = {
    "prepare_threshold": 5,
    "options": "-c lock_timeout=60s -c statement_timeout=180s",
}
# Separate names let several test runs share one PostgreSQL (set with a separate REDIS_URL database).
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="test_exchange")}
# Parallel runs (pytest-xdist, `make test`): each worker flushes and counts in a Redis database of its
# own, the first of its block of TEST_REDIS_DBS (exchange/settings/testnames.py; the test database gets
# its _gwN suffix from pytest-django). A process a test starts with PYTEST_XDIST_WORKER and
# TEST_REDIS_DBS in its environment lands in the same database as its test.
try:
    testnames.pin()
    REDIS_URL = testnames.redis_url()
except testnames.NamingError as exc:
    raise ImproperlyConfigured(str(exc)) from exc
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
