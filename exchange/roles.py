"""Staff permission groups, kept in code so every environment has the same ones.

- Operations: runs the service day to day (switch businesses, lift bans, manage keys and accounts).
- Support (read-only): looks, changes nothing.
Later apps add their models to these lists.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

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
        ],
    },
    "Support (read-only)": {"view": ["*"]},
}


def sync_roles(**_kwargs) -> None:
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
