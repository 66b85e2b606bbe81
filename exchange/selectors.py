from __future__ import annotations

from exchange.models import BusinessStatus, BusinessType


def business_status_list(*, business_type: str | None = None) -> list[dict]:
    """Every business type with its status; a type with no row is on."""
    stored = {row.business_type: row.is_on for row in BusinessStatus.objects.all()}
    types = [business_type] if business_type else list(BusinessType.values)
    return [{"businessType": t, "businessStatus": "on" if stored.get(t, True) else "off"} for t in types]


def business_is_on(business_type: str) -> bool:
    return business_status_list(business_type=business_type)[0]["businessStatus"] == "on"
