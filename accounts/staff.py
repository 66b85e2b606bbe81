"""Staff actions on accounts and API keys that the back office's list actions and key pages call:
each checks the acting staff member's permission (exchange.backoffice.services.require_permission:
StaffNotPermitted, a PermissionDenied) and writes its audit row (staff_action) in the same
transaction as the change, whoever calls it. Changing or creating an account is
accounts.services.user_change_by_staff and user_create_by_staff."""

from __future__ import annotations

from accounts import services
from accounts.models import ApiKey, User
from exchange.backoffice.services import require_permission, require_reason, staff_action, summary

USER_STATE_FIELDS = ("email", "is_active", "is_frozen", "can_trade", "can_deposit", "can_withdraw")
API_KEY_FIELDS = ("user", "name", "key", "types", "status", "ip_restrict", "ip_list")  # never the secret

NOT_YOURS = "Staff and house accounts are not yours to change."


def account_set_frozen(*, actor: User, user: User, frozen: bool, reason: str | None) -> User:
    """Freeze or unfreeze `user` (accounts.services.user_set_frozen), by a staff member who may
    change accounts, for `reason`; audited as account.freeze or account.unfreeze. Refused before
    anything changes without a reason (ReasonRequired), without the permission (StaffNotPermitted)
    and for a staff or house account the actor may not change (StaffChangeRefused)."""
    reason = require_reason(reason)
    require_permission(actor, "accounts.change_user", "You may not freeze or unfreeze accounts.")
    if user.system_role is not None or not services.may_edit_user(actor, user):
        raise services.StaffChangeRefused(NOT_YOURS)
    with staff_action(
        actor=actor,
        action="account.freeze" if frozen else "account.unfreeze",
        reason=reason,
        target=user,
        fields=USER_STATE_FIELDS,
    ) as draft:
        done = services.user_set_frozen(user=user, frozen=frozen, by=actor)
        draft.after = summary(done, USER_STATE_FIELDS)
    return done


def api_key_issue(
    *,
    actor: User,
    user: User,
    name: str,
    types: list[str] | None,
    ip_list: list[str] | None,
    ip_restrict: bool | None,
    reason: str | None,
) -> services.CreatedApiKey:
    """A Read-only key for `user` made by a staff member who may add keys
    (accounts.services.api_key_issue_by_staff), for `reason`; audited as api_key.create (never its
    secret). Refused before anything changes like account_set_frozen."""
    reason = require_reason(reason)
    require_permission(actor, "accounts.add_apikey", "You may not create API keys.")
    with staff_action(actor=actor, action="api_key.create", reason=reason) as draft:
        created = services.api_key_issue_by_staff(
            user=user, name=name, types=types, ip_list=ip_list, ip_restrict=ip_restrict
        )
        draft.target = created.api_key
        draft.after = summary(created.api_key, API_KEY_FIELDS)
    return created


def api_key_change(
    *,
    actor: User,
    api_key: ApiKey,
    name: str,
    types: list[str],
    enabled: bool,
    ip_restrict: bool,
    ip_list: list[str],
    reason: str | None,
) -> ApiKey:
    """A staff change of a key (accounts.services.api_key_change_by_staff: its types only ever
    narrowed), by a staff member who may change keys, for `reason`; audited as api_key.change."""
    reason = require_reason(reason)
    require_permission(actor, "accounts.change_apikey", "You may not change API keys.")
    before = summary(ApiKey.objects.get(pk=api_key.pk), API_KEY_FIELDS)  # as stored, not as a form left it
    with staff_action(actor=actor, action="api_key.change", reason=reason, target=api_key, before=before) as draft:
        changed = services.api_key_change_by_staff(
            api_key=api_key, name=name, types=types, enabled=enabled, ip_restrict=ip_restrict, ip_list=ip_list
        )
        draft.after = summary(changed, API_KEY_FIELDS)
    return changed


def api_key_set_status(*, actor: User, api_key: ApiKey, enabled: bool, reason: str | None) -> ApiKey:
    """Enable or disable a key, by a staff member who may change keys, for `reason`; audited as
    api_key.enable or api_key.disable."""
    reason = require_reason(reason)
    require_permission(actor, "accounts.change_apikey", "You may not enable or disable API keys.")
    with staff_action(
        actor=actor,
        action="api_key.enable" if enabled else "api_key.disable",
        reason=reason,
        target=api_key,
        fields=API_KEY_FIELDS,
    ) as draft:
        done = services.api_key_set_status(api_key=api_key, enabled=enabled)
        draft.after = summary(done, API_KEY_FIELDS)
    return done
