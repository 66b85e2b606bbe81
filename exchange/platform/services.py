"""Writes of the service's own domain: business status, and the staff actions on it and on the
gateway's ban rows (exchange/api/ratelimit/bans.py; the gateway knows nothing of staff, so the
audited lifting is here). A staff action checks the staff member's permission
(exchange.backoffice.services.require_permission: StaffNotPermitted, a PermissionDenied) and writes
its audit row in the same transaction as the change."""

from __future__ import annotations

from exchange.api import ratelimit
from exchange.api.models import RateLimitBan
from exchange.backoffice.services import require_permission, require_reason, staff_action, summary
from exchange.platform.models import BusinessStatus, BusinessType

STATUS_FIELDS = ("business_type", "is_on")


def business_status_set(*, business_type: str, is_on: bool, updated_by=None) -> BusinessStatus:
    status, _ = BusinessStatus.objects.update_or_create(
        business_type=business_type, defaults={"is_on": is_on, "updated_by": updated_by}
    )
    return status


def business_status_switch(*, actor, business_type: str, is_on: bool, reason: str | None) -> BusinessStatus:
    """Switch a business (SPOT, CONVERT) on or off, by a staff member who may change business
    status, for `reason`; audited as business_status.set. Refused before anything changes without a
    reason (ReasonRequired) or the permission (StaffNotPermitted)."""
    reason = require_reason(reason)
    require_permission(actor, "exchange.change_businessstatus", "You may not switch businesses on or off.")
    row = BusinessStatus.objects.filter(business_type=business_type).first()
    with staff_action(
        actor=actor, action="business_status.set", reason=reason, target=row, fields=STATUS_FIELDS
    ) as draft:
        stored = business_status_set(business_type=business_type, is_on=is_on, updated_by=actor)
        draft.target = stored
        draft.after = summary(stored, STATUS_FIELDS)
    return stored


def ban_lift(*, actor, ban: RateLimitBan, reason: str | None) -> RateLimitBan:
    """Lift a 418 ban now (exchange.api.ratelimit.rate_limit_ban_lift), by a staff member who may
    change bans, for `reason`; audited as ban.lift. Refused like business_status_switch."""
    reason = require_reason(reason)
    require_permission(actor, "exchange.change_ratelimitban", "You may not lift bans.")
    with staff_action(actor=actor, action="ban.lift", reason=reason, target=ban, before=summary(ban)) as draft:
        lifted = ratelimit.rate_limit_ban_lift(ban=ban, lifted_by=actor)
        draft.after = summary(lifted)
    return lifted


def business_status_seed(**_kwargs) -> None:
    """SPOT and CONVERT rows exist (on) after every migrate; operators switch them in the admin."""
    for business_type in BusinessType.values:
        BusinessStatus.objects.get_or_create(business_type=business_type, defaults={"is_on": True})
