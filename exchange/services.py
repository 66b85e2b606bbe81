"""Writes owned by the exchange app: business status and rate-limit bans."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from exchange.api import ratelimit
from exchange.models import BusinessStatus, RateLimitBan

logger = logging.getLogger(__name__)


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
    ratelimit.counters().ban(ratelimit.ban_key(ip), duration)
    logger.warning("IP %s banned for %s s (offence %s): %s", ip, duration, offence, reason)
    return ban


def rate_limit_ban_lift(*, ban: RateLimitBan, lifted_by=None) -> RateLimitBan:
    """End a ban now. Lifting an older ban of an address lifts the address."""
    now = timezone.now()
    with transaction.atomic():
        RateLimitBan.objects.filter(ip=ban.ip, lifted_at__isnull=True, expires_at__gt=now).update(
            lifted_at=now, lifted_by=lifted_by
        )
    ratelimit.forgive(ban.ip)
    ban.refresh_from_db()
    logger.info("Ban of %s lifted by %s", ban.ip, lifted_by)
    return ban


def business_status_set(*, business_type: str, is_on: bool, updated_by=None) -> BusinessStatus:
    status, _ = BusinessStatus.objects.update_or_create(
        business_type=business_type, defaults={"is_on": is_on, "updated_by": updated_by}
    )
    return status


def business_status_seed(**_kwargs) -> None:
    """SPOT and CONVERT rows exist (on) after every migrate; operators switch them in the admin."""
    from exchange.models import BusinessType

    for business_type in BusinessType.values:
        BusinessStatus.objects.get_or_create(business_type=business_type, defaults={"is_on": True})
