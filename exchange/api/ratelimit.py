"""Weighted request limits per IP and per UID, and the 418 ban for clients that ignore a 429.

Counters live in the `limits` library's storage: Redis in the full stack, process memory in the
embedded default. Each counter is a fixed one-minute window that starts at its first request;
refused requests count too, so hammering keeps a client refused. A client that sends another
request after having been told 429 in the same window is banned: 2 minutes for a first offence,
doubling per offence within the last 3 days, capped at 3 days. Bans are rows of
`exchange.RateLimitBan` (visible and liftable in the admin) mirrored into the storage, which is
what the request path reads.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache

from django.conf import settings
from limits import RateLimitItemPerMinute
from limits.storage import Storage, storage_from_string
from redis.exceptions import RedisError

from exchange.api.errors import IpBanned, TooManyRequests

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
USED_WEIGHT_HEADER = "X-SERVICE-USED-WEIGHT-1M"
USED_UID_WEIGHT_HEADER = "X-SERVICE-USED-UID-WEIGHT-1M"
STORAGE_ERRORS = (RedisError, OSError)


@lru_cache(maxsize=4)
def _storage_for(url: str) -> Storage:
    return storage_from_string(url)


def storage() -> Storage:
    return _storage_for(settings.RATE_LIMIT_STORAGE_URL)


def ban_key(ip: str) -> str:
    return f"exchange/ban/{ip}"


def _warned_key(ip: str) -> str:
    return f"exchange/warned/{ip}"


@dataclass
class UsedWeight:
    """What this request consumed, for the used-weight headers."""

    ip: int | None = None
    uid: int | None = None
    extra: dict = field(default_factory=dict)


def used_weight(http_request) -> UsedWeight:
    state = getattr(http_request, "_used_weight", None)
    if state is None:
        state = UsedWeight()
        http_request._used_weight = state
    return state


def _django_request(request):
    return getattr(request, "_request", request)


def apply_weight_headers(request, response) -> None:
    state = getattr(_django_request(request), "_used_weight", None)
    if state is None:
        return
    if state.ip is not None:
        response[USED_WEIGHT_HEADER] = str(state.ip)
    if state.uid is not None:
        response[USED_UID_WEIGHT_HEADER] = str(state.uid)


def _seconds_until(expiry_epoch: float) -> int:
    return max(1, math.ceil(expiry_epoch - time.time()))


def check_ban(ip: str) -> None:
    """Refuse a banned address with 418 and the seconds until the ban ends."""
    store = storage()
    key = ban_key(ip)
    try:
        if not store.get(key):
            return
        retry_after = _seconds_until(store.get_expiry(key))
    except STORAGE_ERRORS:
        logger.exception("Rate-limit storage unavailable; ban check skipped")
        return
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + retry_after))
    raise IpBanned(until, headers={"Retry-After": str(retry_after)})


def hit(request, *, counter: str, identifier: str, weight: int, ip: str) -> None:
    """Add `weight` to the `counter` ("ip" or "uid") of `identifier`; refuse beyond the limit."""
    limit = settings.IP_WEIGHT_LIMIT_PER_MINUTE if counter == "ip" else settings.UID_WEIGHT_LIMIT_PER_MINUTE
    item = RateLimitItemPerMinute(limit, namespace=f"exchange-{counter}")
    key = item.key_for(identifier)
    store = storage()
    try:
        count = store.incr(key, item.get_expiry(), amount=weight)
    except STORAGE_ERRORS:
        # Limits protect capacity, not money: an outage of their storage must not stop trading.
        logger.exception("Rate-limit storage unavailable; request not counted")
        return
    setattr(used_weight(_django_request(request)), counter, count)
    if count <= limit:
        return
    retry_after = _seconds_until(store.get_expiry(key))
    warned = store.incr(_warned_key(ip), retry_after)
    if warned == 1:
        raise TooManyRequests(limit, "1 minute", headers={"Retry-After": str(retry_after)})
    if warned == 2:  # exactly one request per window creates the ban
        from exchange.services import rate_limit_ban_create

        rate_limit_ban_create(ip=ip, reason=f"continued after 429 on the {counter} limit ({count}/{limit})")
    check_ban(ip)
    raise IpBanned("the ban is recorded", headers={"Retry-After": str(retry_after)})
