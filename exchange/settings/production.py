"""Production: everything from the environment, and no insecure defaults."""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import (
    API_SECRET_ENCRYPTION_KEYS,
    DATABASES,
    INSECURE_DEFAULT_SECRET_KEY,
    RATE_LIMIT_STORAGE_URL,
    REDIS_URL,
    SECRET_KEY,
    env,
)

if SECRET_KEY == INSECURE_DEFAULT_SECRET_KEY or len(SECRET_KEY) < 40:
    raise ImproperlyConfigured("Set SECRET_KEY to a long random value in production.")
if not API_SECRET_ENCRYPTION_KEYS:
    raise ImproperlyConfigured("Set API_SECRET_ENCRYPTION_KEYS (Fernet keys) in production.")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    raise ImproperlyConfigured("Set DATABASE_URL to PostgreSQL in production.")
if not REDIS_URL:
    raise ImproperlyConfigured("Set REDIS_URL in production (rate limits, channel layer, broker).")
if not RATE_LIMIT_STORAGE_URL.startswith(("redis://", "rediss://", "redis+unix://", "redis+sentinel://")):
    # Per-process memory would give each worker its own replay memory: a replay to another worker
    # would pass (docs/security.md, M1).
    raise ImproperlyConfigured("RATE_LIMIT_STORAGE_URL must be a Redis shared by every process in production.")

DEBUG = False
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
