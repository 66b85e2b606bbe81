"""listenKeys: start (or reuse and extend), keep alive, close; and close them all when the API key
that holds them, or their account, may no longer use them."""

from __future__ import annotations

import logging
import secrets
import string
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from accounts.models import ApiKey, ApiKeyStatus, User
from accounts.revocation_log import log_revocation
from exchange.api import ratelimit
from exchange.api.errors import (
    AccountFrozen,
    ApiKeyNotEnabled,
    CreateListenKeyFailed,
    CreateListenKeyRateLimit,
    Disconnected,
    ListenKeyExpired,
)
from exchange.runtime.outage import Outage
from streams.models import ListenKey, ListenKeyHolder
from streams.store import store

logger = logging.getLogger(__name__)
# Requests and handshakes that need the listenKey store while it is away: logged once, then every 10 s.
STORE_OUTAGE = Outage(logger, "listenKey store unavailable: listenKey requests answered -1001/-1126, handshakes 1011")
_ALPHABET = string.ascii_letters + string.digits
# What an unreachable or failing Redis raises (redis-py's own errors, and the socket's).
STORE_ERRORS = (RedisError, OSError)
# Records whose key expired longer ago than this are not revoked again (their key is dead anyway);
# the margin covers the difference between the database's clock and Redis's.
REVOKE_EXPIRED_MARGIN = timedelta(minutes=5)


def key_group(key: str) -> str:
    return f"streams.lk.{key}"


def listen_key_start(*, account, api_key: str | None = None) -> str:
    """The account's live key, extended by the TTL; or a new one (at most
    LISTEN_KEY_CREATE_LIMIT_PER_HOUR new keys an hour, else -1026). `api_key` (the caller's key, as
    text) is recorded as a holder of the key: disabling or deleting it closes the key."""
    if account.is_frozen:  # the gateway refuses its keys too (exchange/api/auth.py)
        raise AccountFrozen()
    ttl = settings.LISTEN_KEY_TTL_SECONDS
    keys = store()
    try:
        current = keys.active_key(account.pk)
        # A key whose record is closed is not handed out again, even if the store still has it
        # (embedded: closed by another process, whose store is not this one's).
        if (
            current is not None
            and keys.extend(current, ttl)
            and ListenKey.objects.filter(key=current, closed_at__isnull=True).update(
                expires_at=timezone.now() + timedelta(seconds=ttl)
            )
        ):
            _hold(current, api_key)
            key = current
        else:
            limit = settings.LISTEN_KEY_CREATE_LIMIT_PER_HOUR
            created = ratelimit.counters().incr(f"streams/created/{account.pk}", 3600)
            if created > limit:
                raise CreateListenKeyRateLimit(limit)
            key = "".join(secrets.choice(_ALPHABET) for _ in range(60))
            # The record and its holder first: a connection on the key finds them (consumers.py).
            ListenKey.objects.create(key=key, account=account, expires_at=timezone.now() + timedelta(seconds=ttl))
            _hold(key, api_key)
            try:
                keys.put(key, account.pk, ttl)
            except STORE_ERRORS:
                ListenKey.objects.filter(key=key).update(closed_at=timezone.now())
                raise
    except STORE_ERRORS as exc:
        STORE_OUTAGE.failed(exc)
        raise CreateListenKeyFailed() from exc
    STORE_OUTAGE.ok()
    # The API key may have been disabled (or the account frozen) while this request ran: the
    # revocation after that commit then looked for holders before ours was written. Either it saw
    # our holder row, or we see its change here (both read after their own write committed).
    if not _may_stream(account.pk, api_key):
        _revoke_quietly([key])
        raise ApiKeyNotEnabled()
    return key


def _hold(key: str, api_key: str | None) -> None:
    if api_key is not None:
        ListenKeyHolder.objects.bulk_create(
            [ListenKeyHolder(listen_key_id=key, api_key=api_key)], ignore_conflicts=True
        )


def _may_stream(account_id: int, api_key: str | None) -> bool:
    accounts = User.objects.filter(pk=account_id, is_active=True, is_frozen=False)
    if api_key is None:
        return accounts.exists()
    return ApiKey.objects.filter(key=api_key, user__in=accounts, status=ApiKeyStatus.ENABLE).exists()


def _owned(account, key: str) -> None:
    try:
        owner = store().owner(key)
    except STORE_ERRORS as exc:
        STORE_OUTAGE.failed(exc)
        raise Disconnected() from exc
    STORE_OUTAGE.ok()
    if owner != account.pk:
        raise ListenKeyExpired()


def listen_key_keepalive(*, account, key: str) -> None:
    _owned(account, key)
    ttl = settings.LISTEN_KEY_TTL_SECONDS
    try:
        extended = store().extend(key, ttl)
    except STORE_ERRORS as exc:
        STORE_OUTAGE.failed(exc)
        raise Disconnected() from exc
    if not extended:
        raise ListenKeyExpired()
    ListenKey.objects.filter(key=key).update(expires_at=timezone.now() + timedelta(seconds=ttl))


def listen_key_close(*, account, key: str) -> None:
    _owned(account, key)
    try:
        listen_key_revoke(key=key)
    except STORE_ERRORS as exc:
        STORE_OUTAGE.failed(exc)
        raise Disconnected() from exc


def listen_key_revoke(*, key: str) -> None:
    """Kill a key (its owner's DELETE, or an operator): the key is dead and its streams close."""
    store().delete(key)
    ListenKey.objects.filter(key=key, closed_at__isnull=True).update(closed_at=timezone.now())
    _log_closed([key])
    _announce_closed([key])


def listen_keys_revoke_for_api_key(*, api_key: str) -> list[str]:
    """Close every live listenKey `api_key` was handed (it was disabled or deleted)."""
    return _revoke_quietly(_live(ListenKey.objects.filter(holders__api_key=api_key)))


def listen_keys_revoke_for_account(*, account_id: int) -> list[str]:
    """Close every live listenKey of the account (it was deactivated or frozen)."""
    return _revoke_quietly(_live(ListenKey.objects.filter(account_id=account_id)))


def _live(records) -> list[str]:
    oldest = timezone.now() - REVOKE_EXPIRED_MARGIN
    return list(records.filter(closed_at__isnull=True, expires_at__gt=oldest).values_list("key", flat=True).distinct())


def _revoke_quietly(keys: list[str]) -> list[str]:
    """Revoke after a commit: every step is tried even when another fails (and logged), since the
    change that asked for it has committed. The record is closed first: connections are refused
    from then on (consumers.py checks it) even if Redis cannot be told."""
    if not keys:
        return keys
    ListenKey.objects.filter(key__in=keys, closed_at__isnull=True).update(closed_at=timezone.now())
    for key in keys:
        try:
            store().delete(key)
        except STORE_ERRORS:
            logger.exception("Could not delete listenKey %s… from the store", key[:12])
    try:
        _log_closed(keys)
    except Exception:
        logger.exception("Could not log the close of %s listenKey(s)", len(keys))
    try:
        _announce_closed(keys)
    except Exception:
        logger.exception("Could not tell the streams of %s listenKey(s) to close", len(keys))
    logger.info("Closed %s listenKey(s)", len(keys))
    return keys


def _log_closed(keys: list[str]) -> None:
    """Without Redis the store and the channel layer are this process's memory: a key closed here
    (a `manage.py` command, a shell) reaches the server's connections through the database's
    revocation log, whose move makes every watcher check its keys (streams/watcher.py)."""
    if settings.REDIS_URL:
        return
    for account_id in sorted(set(ListenKey.objects.filter(key__in=keys).values_list("account_id", flat=True))):
        log_revocation(account_id)


def _announce_closed(keys: list[str]) -> None:
    """Every connection on these keys, in every server process, closes (or drops a further key)."""
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all() -> None:
        for key in keys:
            await layer.group_send(key_group(key), {"type": "listenkey.closed", "key": key})

    async_to_sync(send_all)()
