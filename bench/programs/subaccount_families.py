"""bench/subaccounts' families: argv `domain count subs-each collector`; two funded virtual sub-accounts
for each of the domain's first `count` accounts and a collector with `subs-each` sub-accounts and an
API key; prints `{"families": ..., "collector": ...}` as JSON."""

import json
import sys
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.db import transaction

    from accounts import ledger, services
    from accounts.ledger.models import BusinessType
    from accounts.models import SystemRole, User

    domain, count, subs_each, collector = argv[0], int(argv[1]), int(argv[2]), argv[3]
    equity = ledger.system_account_id(SystemRole.EQUITY)
    out = {"families": [], "collector": None}
    with transaction.atomic():
        masters = list(User.objects.filter(email__endswith="@" + domain).order_by("id")[:count])
        legs = []
        for master in masters:
            subs = [
                services.user_create(
                    email=f"{master.email.split('@')[0]}-sub{n}@{domain}", master=master, is_virtual=True
                )
                for n in (1, 2)
            ]
            legs += [ledger.Leg(equity, "PHP", Decimal(-200000))] + [
                ledger.Leg(s.pk, "PHP", Decimal(100000)) for s in subs
            ]
            out["families"].append([s.email for s in subs])
        ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference="bench:subaccounts:families")
        boss = services.user_create(email=collector)
        key = services.api_key_create(user=boss, name="bench")
        for n in range(subs_each):
            services.user_create(email=f"collect{n}@{domain}", master=boss, is_virtual=True)
    out["collector"] = [boss.email, key.api_key.key, key.secret]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
