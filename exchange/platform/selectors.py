from __future__ import annotations

from typing import NamedTuple

from exchange.platform.models import BusinessStatus, BusinessType


class BusinessStatusRow(NamedTuple):
    business_type: str
    is_on: bool


def business_status_list(*, business_type: str | None = None) -> list[BusinessStatusRow]:
    """Every business type (or only `business_type`) with its status; a type with no row is on."""
    stored = {row.business_type: row.is_on for row in BusinessStatus.objects.all()}
    types = [business_type] if business_type else list(BusinessType.values)
    return [BusinessStatusRow(t, stored.get(t, True)) for t in types]


def business_is_on(business_type: str) -> bool:
    return business_status_list(business_type=business_type)[0].is_on
