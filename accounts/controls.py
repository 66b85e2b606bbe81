"""How staff change the accounts app's settings that matter to money (exchange/backoffice/changes.py): which
fields are changed only with a second Administrator's approval, because changing them that way
loosens a control.

- Asset.reference_price values every movement for the limits, the withdrawal approval and
  four-eyes thresholds and the travel rule: lowering it (to 0 above all) loosens all of them.
  Raising it tightens them and applies at once. `transfer_min_quantity` lowered loosens;
  `transfer_precision` raised loosens (smaller amounts); `is_fiat` decides which key type moves the
  asset: any change waits.
- TierLimit amounts: raising a limit loosens it. LimitTier: its currency (what the amounts mean)
  and which tier is the default: any change waits.
- User.master: a master moves its sub-accounts' money, so any change of it waits, and is refused
  while the account holds anything (accounts.services.user_reparent_check). User.limit_tier: any
  change waits (another tier may have higher limits).
"""

from __future__ import annotations

from accounts import services
from accounts.models import Asset, LimitTier, TierLimit, User
from exchange.backoffice.changes import ANY, AUDITED, HIGHER, LOWER, ChangeRefused, guard


def _reparent_check(user: User, changes: dict) -> None:
    if "master" not in changes:
        return
    try:
        services.user_reparent_check(user=user, master_id=changes["master"])
    except services.StaffChangeRefused as exc:
        raise ChangeRefused(str(exc)) from exc


def _apply_user(user: User, changes: dict) -> User:
    if "master" in changes:
        user = services.user_set_master(user=user, master_id=changes["master"])
    if "limit_tier" in changes:
        user.limit_tier_id = changes["limit_tier"]
        user.save(update_fields=["limit_tier"])
    return user


def register() -> None:
    guard(
        Asset,
        action="asset",
        fields={
            "name": AUDITED,
            "reference_price": LOWER,
            "transfer_min_quantity": LOWER,
            "transfer_precision": HIGHER,
            "is_fiat": ANY,
        },
    )
    guard(LimitTier, action="limit_tier", fields={"name": AUDITED, "currency": ANY, "is_default": ANY})
    guard(
        TierLimit,
        action="tier_limit",
        fields={
            "tier": ANY,
            "period": ANY,
            "cash_in_limit": HIGHER,
            "cash_out_limit": HIGHER,
            "total_withdraw_limit": HIGHER,
        },
    )
    guard(
        User,
        action="account",
        fields={"master": ANY, "limit_tier": ANY},
        precondition=_reparent_check,
        apply=_apply_user,
    )
