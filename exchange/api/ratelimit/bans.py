"""418 bans: the `RateLimitBan` rows (what ops see and lift in the admin) and their mirror in the
storage (what the request path reads), kept together; the escalation of a repeat offence."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from exchange.api.models import RateLimitBan
from exchange.api.ratelimit.storage import counters, limit_item

logger = logging.getLogger(__package__)  # exchange.api.ratelimit, as before the split


def ban_key(ip: str) -> str:
    return f"exchange/ban/{ip}"


def warned_key(ip: str) -> str:
    return f"exchange/warned/{ip}"


def forgive(ip: str) -> None:
    """Forget an IP's ban, warning and current IP window (a lifted ban lets it in at once)."""
    store = counters()
    for key in (ban_key(ip), warned_key(ip), limit_item("ip").key_for(ip)):
        store.clear(key)


def ban_duration_seconds(*, offence: int) -> int:
    """2 minutes for a first offence, doubling with each repeat, at most 3 days (settings)."""
    low, high = settings.RATE_LIMIT_BAN_MIN_SECONDS, settings.RATE_LIMIT_BAN_MAX_SECONDS
    return min(high, low * 2 ** min(offence - 1, 40))


def rate_limit_ban_create(*, ip: str, reason: str) -> RateLimitBan:
    now = timezone.now()
    escalation_start = now - timedelta(seconds=settings.RATE_LIMIT_BAN_MAX_SECONDS)
    offence = RateLimitBan.objects.filter(ip=ip, created_at__gte=escalation_start).count() + 1
    duration = ban_duration_seconds(offence=offence)
    with transaction.atomic():
        ban = RateLimitBan.objects.create(
            ip=ip,
            offence=offence,
            duration_seconds=duration,
            reason=reason[:200],
            expires_at=now + timedelta(seconds=duration),
        )
    counters().ban(ban_key(ip), duration)
    logger.warning("IP %s banned for %s s (offence %s): %s", ip, duration, offence, reason)
    return ban


def rate_limit_ban_lift(*, ban: RateLimitBan, lifted_by=None) -> RateLimitBan:
    """End a ban now. Lifting an older ban of an address lifts the address."""
    now = timezone.now()
    with transaction.atomic():
        RateLimitBan.objects.filter(ip=ban.ip, lifted_at__isnull=True, expires_at__gt=now).update(
            lifted_at=now, lifted_by=lifted_by
        )
    forgive(ban.ip)
    ban.refresh_from_db()
    logger.info("Ban of %s lifted by %s", ban.ip, lifted_by)
    return ban
