"""The general endpoints' records as the spec renders them. The selectors return Python values;
only the API layer calls these."""

from __future__ import annotations

from exchange.platform.selectors import BusinessStatusRow


def business_status_json(row: BusinessStatusRow) -> dict:
    return {"businessType": row.business_type, "businessStatus": "on" if row.is_on else "off"}
