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
- User.email and User.phone are the addresses transfers are sent to: whoever holds an address
  receives what is sent there, so any change of either waits (issue 34, finding 1), and is refused
  when proposed and again when approved if another account has the address (the phone compared
  normalised, accounts/phones.py). User.is_virtual decides who may reach the account (a virtual
  sub-account only from its family): any change waits. User.enable_withdraw_whitelist switched off
  lets money out to any address: that waits; switching it on applies at once.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts import services
from accounts.models import Asset, LimitTier, TierLimit, User
from exchange.backoffice.changes import ANY, AUDITED, HIGHER, LOWER, ChangeRefused, apply_fields, guard


def _switched_off(old, new) -> bool:
    return bool(old) and not bool(new)


def _user_check(user: User, changes: dict) -> None:
    """When proposed and again when approved (under the row's lock): the account may take the change."""
    try:
        if "master" in changes:
            services.user_reparent_check(user=user, master_id=changes["master"])
        if "email" in changes:
            wanted = changes["email"]
            if services.email_clean(wanted, exclude_id=user.pk, keep=user.email) != wanted:
                raise services.StaffChangeRefused("An e-mail is stored in lower case.")
        if "phone" in changes and changes["phone"] is not None:
            wanted = changes["phone"]
            if services.phone_clean(wanted, exclude_id=user.pk) != wanted:
                raise services.StaffChangeRefused("A phone number is stored normalised (accounts/phones.py).")
    except ValueError as exc:  # StaffChangeRefused included
        raise ChangeRefused(str(exc)) from exc


def _apply_user(user: User, changes: dict) -> User:
    if "master" in changes:
        user = services.user_set_master(user=user, master_id=changes["master"])
    if "limit_tier" in changes:
        user.limit_tier_id = changes["limit_tier"]
        user.save(update_fields=["limit_tier"])
    rest = {name: value for name, value in changes.items() if name not in ("master", "limit_tier")}
    if rest:
        try:
            with transaction.atomic():  # an address taken since the check: refused, not a 500
                user = apply_fields(user, rest)
        except (IntegrityError, ValidationError) as exc:
            raise ChangeRefused(f"{user} cannot take this change now: {exc}") from exc
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
        fields={
            "email": ANY,
            "phone": ANY,
            "master": ANY,
            "is_virtual": ANY,
            "limit_tier": ANY,
            "enable_withdraw_whitelist": _switched_off,
        },
        precondition=_user_check,
        apply=_apply_user,
    )
