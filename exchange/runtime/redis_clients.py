"""Every redis-py client the project makes, from one place, so that each finds the Redis primary the
same way: at REDIS_URL's address, or through Redis Sentinel when REDIS_SENTINELS is set (settings
base.py; docs/scaling.md). In Sentinel mode REDIS_URL still names the database number and the
password; its host is not dialled: each connection asks the sentinels which server is the primary of
REDIS_SENTINEL_MASTER now, so a failover needs no restart and no change of configuration. The
sentinels get their own password, REDIS_SENTINEL_PASSWORD (settings.REDIS_SENTINEL_KWARGS).

The channel layer (channels_redis, and streams/fanout.py's synchronous pool over the same host
dictionary), Celery's broker (kombu's `sentinel://` transport) and the rate limits (`limits`'
`redis+sentinel://` storage) are configured in settings from the same two variables.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from django.conf import settings


def url_database(url: str) -> int:
    """The database number of a redis:// URL (its path, `/N`; 0 when absent)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def url_password(url: str) -> str | None:
    password = urlsplit(url).password
    return unquote(password) if password else None


def sentinels() -> list[tuple[str, int]]:
    """The sentinels' addresses (empty: no Sentinel, REDIS_URL is the server)."""
    return list(getattr(settings, "REDIS_SENTINELS", []) or [])


def client(url: str | None = None, **kwargs):
    """A redis-py client of the database at `url` (REDIS_URL by default), with redis-py's `kwargs`
    (timeouts, decode_responses): through Sentinel when configured, else `Redis.from_url`."""
    import redis

    url = url or settings.REDIS_URL
    found = sentinels()
    if not found:
        return redis.Redis.from_url(url, **kwargs)
    from redis.sentinel import Sentinel

    # Timeouts and the sentinels' own password (settings.REDIS_SENTINEL_KWARGS); Redis's is the URL's.
    sentinel = Sentinel(found, sentinel_kwargs=dict(settings.REDIS_SENTINEL_KWARGS))
    password = url_password(url)
    return sentinel.master_for(
        settings.REDIS_SENTINEL_MASTER,
        db=url_database(url),
        **({"password": password} if password else {}),
        **kwargs,
    )
