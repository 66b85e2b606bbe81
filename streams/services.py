"""listenKeys: start (or reuse and extend), keep alive, close."""

from __future__ import annotations

import logging
import secrets
import string
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from exchange.api import ratelimit
from exchange.api.errors import CreateListenKeyFailed, CreateListenKeyRateLimit, ListenKeyExpired
from streams.models import ListenKey
from streams.store import store

logger = logging.getLogger(__name__)
_ALPHABET = string.ascii_letters + string.digits
STORE_ERRORS = (OSError, ConnectionError)


def key_group(key: str) -> str:
    return f"streams.lk.{key}"


def listen_key_start(*, account) -> str:
    """The account's live key, extended by the TTL; or a new one (at most
    LISTEN_KEY_CREATE_LIMIT_PER_HOUR new keys an hour, else -1026)."""
    ttl = settings.LISTEN_KEY_TTL_SECONDS
    keys = store()
    try:
        current = keys.active_key(account.pk)
        if current is not None and keys.extend(current, ttl):
            ListenKey.objects.filter(key=current).update(expires_at=timezone.now() + timedelta(seconds=ttl))
            return current
        limit = settings.LISTEN_KEY_CREATE_LIMIT_PER_HOUR
        created = ratelimit.counters().incr(f"streams/created/{account.pk}", 3600)
        if created > limit:
            raise CreateListenKeyRateLimit(limit)
        key = "".join(secrets.choice(_ALPHABET) for _ in range(60))
        keys.put(key, account.pk, ttl)
    except STORE_ERRORS as exc:
        logger.exception("listenKey store unavailable")
        raise CreateListenKeyFailed() from exc
    ListenKey.objects.create(key=key, account=account, expires_at=timezone.now() + timedelta(seconds=ttl))
    return key


def _owned(account, key: str) -> None:
    if store().owner(key) != account.pk:
        raise ListenKeyExpired()


def listen_key_keepalive(*, account, key: str) -> None:
    _owned(account, key)
    ttl = settings.LISTEN_KEY_TTL_SECONDS
    if not store().extend(key, ttl):
        raise ListenKeyExpired()
    ListenKey.objects.filter(key=key).update(expires_at=timezone.now() + timedelta(seconds=ttl))


def listen_key_close(*, account, key: str) -> None:
    _owned(account, key)
    listen_key_revoke(key=key)


def listen_key_revoke(*, key: str) -> None:
    """Kill a key (its owner's DELETE, or an operator): the key is dead and its streams close."""
    store().delete(key)
    ListenKey.objects.filter(key=key, closed_at__isnull=True).update(closed_at=timezone.now())
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(key_group(key), {"type": "listenkey.closed", "key": key})
