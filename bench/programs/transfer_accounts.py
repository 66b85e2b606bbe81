"""bench/transfers' accounts (also bench/subaccounts' and bench/convert's): argv `count domain`; `count`
users `t<i>@<domain>` with an API key and 1,000,000 PHP; prints `[[email, api_key, secret], ...]`
as JSON."""

import json
import sys
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.db import transaction

    from accounts import ledger, services
    from accounts.ledger.models import BusinessType
    from accounts.models import LedgerAccount, SystemRole, User

    count, domain = int(argv[0]), argv[1]
    with transaction.atomic():
        User.objects.bulk_create([User(email=f"t{i}@{domain}", password="!") for i in range(count)])
        users = list(User.objects.filter(email__endswith="@" + domain).order_by("id"))
        LedgerAccount.objects.bulk_create([LedgerAccount(user=u) for u in users], ignore_conflicts=True)
        equity = ledger.system_account_id(SystemRole.EQUITY)
        each = Decimal(1_000_000)
        legs = [ledger.Leg(equity, "PHP", -each * len(users))] + [ledger.Leg(u.pk, "PHP", each) for u in users]
        ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference="bench:transfers:funding")
        keys = [services.api_key_create(user=u, name="bench") for u in users]
    print(json.dumps([[u.email, k.api_key.key, k.secret] for u, k in zip(users, keys, strict=True)]))


if __name__ == "__main__":
    main(sys.argv[1:])
