"""Writes of the service's own domain: business status (the gateway's ban rows:
exchange/api/ratelimit/bans.py)."""

from __future__ import annotations

from exchange.platform.models import BusinessStatus, BusinessType


def business_status_set(*, business_type: str, is_on: bool, updated_by=None) -> BusinessStatus:
    status, _ = BusinessStatus.objects.update_or_create(
        business_type=business_type, defaults={"is_on": is_on, "updated_by": updated_by}
    )
    return status


def business_status_seed(**_kwargs) -> None:
    """SPOT and CONVERT rows exist (on) after every migrate; operators switch them in the admin."""
    for business_type in BusinessType.values:
        BusinessStatus.objects.get_or_create(business_type=business_type, defaults={"is_on": True})
