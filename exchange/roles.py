"""Staff permission groups, kept in code so every environment has the same ones.

- Operations: runs the service day to day (switch businesses, lift bans, manage keys and accounts).
- Support (read-only): looks, changes nothing.
Later apps add their models to these lists.

Neither role can raise anyone's privileges: "change accounts.user" lets Operations edit customer
accounts, but only a superuser sets staff and superuser status, groups and permissions or edits a
staff member's record (accounts/admin.UserAdmin); and no role is ever given a permission on Django's
own apps (groups and permissions themselves, sessions, ...): `sync_roles` refuses to.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ImproperlyConfigured

OUR_APPS = ("exchange", "accounts", "wallet", "convert", "subaccounts", "streams")

ROLES: dict[str, dict[str, list[str]]] = {
    "Operations": {
        "view": ["*"],
        "change": [
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
            "wallet.deposit",
            "wallet.withdrawal",
            "wallet.transfer",
            "wallet.transferfee",
            "convert.market",
            "convert.pair",
        ],
        "add": [
            "accounts.apikey",
            "accounts.user",
            "accounts.manualadjustment",
            "accounts.asset",
            "accounts.limittier",
            "accounts.tierlimit",
            "wallet.network",
            "wallet.whitelistaddress",
            "wallet.transferfee",
            "convert.market",
            "convert.pair",
        ],
    },
    "Support (read-only)": {"view": ["*"]},
}


def _check_roles() -> None:
    for name, grants in ROLES.items():
        for action, models in grants.items():
            for model in models:
                if model != "*" and model.split(".")[0] not in OUR_APPS:
                    # e.g. "auth.group": a member could then grant their own group anything.
                    raise ImproperlyConfigured(f"Role {name!r} may not be given {action} on {model}.")


def sync_roles(**_kwargs) -> None:
    _check_roles()  # before any group is written
    for name, grants in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        wanted = []
        for action, models in grants.items():
            for model in models:
                perms = Permission.objects.filter(codename__startswith=f"{action}_")
                if model == "*":
                    perms = perms.filter(content_type__app_label__in=OUR_APPS)
                else:
                    app_label, model_name = model.split(".")
                    perms = perms.filter(content_type__app_label=app_label, content_type__model=model_name)
                wanted.extend(perms)
        group.permissions.set(wanted)
