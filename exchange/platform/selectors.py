from __future__ import annotations

from typing import NamedTuple

from exchange.platform.models import BusinessStatus, BusinessType
from exchange.runtime.ttlcache import ReferenceCache

# Read by every conversion (twice): cached per process, a switch reaches every process within
# REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py; the invalidating signals are in apps.py).
_statuses = ReferenceCache("business status")


class BusinessStatusRow(NamedTuple):
    business_type: str
    is_on: bool


def business_status_list(*, business_type: str | None = None) -> list[BusinessStatusRow]:
    """Every business type (or only `business_type`) with its status; a type with no row is on."""
    stored = {row.business_type: row.is_on for row in BusinessStatus.objects.all()}
    types = [business_type] if business_type else list(BusinessType.values)
    return [BusinessStatusRow(t, stored.get(t, True)) for t in types]


def _stored_statuses() -> dict[str, bool]:
    return dict(BusinessStatus.objects.values_list("business_type", "is_on"))


def business_is_on(business_type: str) -> bool:
    """A type with no row is on."""
    return _statuses.get("all", _stored_statuses).get(business_type, True)
