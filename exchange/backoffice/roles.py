"""Staff permission groups, kept in code so every environment has the same ones (docs/operations.md).

- Support: read-only everywhere; looks, changes nothing.
- Treasury: the money desk. Approves and rejects withdrawals (a second approver above
  WITHDRAWAL_FOUR_EYES_ABOVE), fills travel-rule data on held deposits, tops up the convert
  liquidity, proposes manual adjustments. No API keys, bans, business status or account changes.
- Administrator: everything operators do: all of Treasury's, plus confirming (or cancelling)
  adjustments that someone else proposed, API keys, business status, bans, freezes, accounts,
  settings that matter to money (a change that loosens a control waits for another
  Administrator's approval: exchange/backoffice/changes.py).
Later apps add their models to these lists.

`sync_roles` writes them after every `migrate` (post_migrate) and on `manage.py sync_roles`. The
groups of earlier versions are folded in: members of "Operations" (which did all of the above but
confirming) become Administrators, members of "Support (read-only)" become Support; the old groups
are then deleted. A member who should only handle money is moved to Treasury by a superuser.

Neither role can raise anyone's privileges: "change accounts.user" lets Administrators edit customer
accounts, but only a superuser sets staff and superuser status, groups and permissions or edits a
staff member's record (accounts/admin.UserAdmin); no role is ever given a permission on Django's
own apps (groups and permissions themselves, sessions, ...) nor a write on the audit trail
(exchange.staffaction): `sync_roles` refuses to.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

OUR_APPS = ("exchange", "accounts", "wallet", "convert", "subaccounts", "streams")

SUPPORT = "Support"
TREASURY = "Treasury"
ADMINISTRATOR = "Administrator"
# Groups of earlier versions and the role their members get.
LEGACY_GROUPS = {"Operations": ADMINISTRATOR, "Support (read-only)": SUPPORT}
# Written only by the service that records each action (exchange.backoffice.services.staff_action).
NEVER_GRANTED = ("exchange.staffaction",)

# "change withdrawal" is the permission wallet/approvals.py requires to approve or reject a
# withdrawal; "change deposit" the one wallet/deposits.py requires to fill travel-rule data.
_TREASURY_CHANGE = ["wallet.deposit", "wallet.withdrawal"]
_TREASURY_ADD = ["accounts.manualadjustment"]  # proposes adjustments; also the convert liquidity top-up

ROLES: dict[str, dict[str, list[str]]] = {
    SUPPORT: {"view": ["*"]},
    TREASURY: {"view": ["*"], "change": _TREASURY_CHANGE, "add": _TREASURY_ADD},
    ADMINISTRATOR: {
        "view": ["*"],
        "change": [
            *_TREASURY_CHANGE,
            "exchange.businessstatus",
            "exchange.ratelimitban",
            "accounts.apikey",
            "accounts.user",
            "accounts.asset",
            "accounts.limittier",
            "accounts.tierlimit",
            "streams.listenkey",
            "wallet.network",
            "wallet.whitelistaddress",
            "wallet.transfer",
            "wallet.transferfee",
            "convert.assetprice",
            "convert.market",
            "convert.pair",
        ],
        "add": [
            *_TREASURY_ADD,
            "accounts.apikey",
            "accounts.user",
            "accounts.asset",
            "accounts.limittier",
            "accounts.tierlimit",
            "wallet.network",
            "wallet.whitelistaddress",
            "wallet.transferfee",
            "convert.assetprice",
            "convert.market",
            "convert.pair",
        ],
        # The second pair of eyes on a manual adjustment (accounts/ledger/services.py).
        "confirm": ["accounts.manualadjustment"],
        # ... and on a change of a setting that loosens a control (exchange/backoffice/changes.py).
        "approve": ["exchange.changerequest"],
    },
}


def _check_roles() -> None:
    for name, grants in ROLES.items():
        for action, models in grants.items():
            for model in models:
                if model != "*" and model.split(".")[0] not in OUR_APPS:
                    # e.g. "auth.group": a member could then grant their own group anything.
                    raise ImproperlyConfigured(f"Role {name!r} may not be given {action} on {model}.")
                if model in NEVER_GRANTED and action != "view":
                    raise ImproperlyConfigured(f"Role {name!r} may not be given {action} on {model}.")


def _permissions(action: str, model: str) -> list[Permission]:
    perms = Permission.objects.filter(codename__startswith=f"{action}_")
    if model == "*":
        perms = perms.filter(content_type__app_label__in=OUR_APPS)
    else:
        app_label, model_name = model.split(".")
        perms = perms.filter(
            content_type__app_label=app_label, content_type__model=model_name, codename=f"{action}_{model_name}"
        )
    return list(perms)


def sync_roles(**_kwargs) -> dict[str, int]:
    """Create or correct the groups; fold the legacy groups' members in. Returns the members moved
    per legacy group. Idempotent."""
    _check_roles()  # before any group is written
    moved: dict[str, int] = {}
    with transaction.atomic():
        groups = {}
        for name, grants in ROLES.items():
            group, _ = Group.objects.get_or_create(name=name)
            wanted = [
                perm for action, models in grants.items() for model in models for perm in _permissions(action, model)
            ]
            group.permissions.set(wanted)
            groups[name] = group
        for legacy_name, role in LEGACY_GROUPS.items():
            legacy = Group.objects.filter(name=legacy_name).first()
            if legacy is None:
                continue
            members = list(legacy.user_set.all())
            groups[role].user_set.add(*members)
            legacy.delete()
            moved[legacy_name] = len(members)
    return moved
