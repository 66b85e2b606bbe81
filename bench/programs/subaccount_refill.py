"""bench/subaccounts' refill: argv `domain round funds-json`; gives every collect sub-account of the
domain the funds again in one posting; prints how many sub-accounts it funded."""

import json
import sys
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from accounts import ledger
    from accounts.ledger.models import BusinessType
    from accounts.models import SystemRole, User

    domain, round_, funds = argv[0], argv[1], json.loads(argv[2])
    subs = list(User.objects.filter(email__startswith="collect", email__endswith="@" + domain).order_by("id"))
    equity = ledger.system_account_id(SystemRole.EQUITY)
    legs = []
    for code, amount in funds.items():
        each = Decimal(amount)
        legs += [ledger.Leg(equity, code, -each * len(subs))] + [ledger.Leg(s.pk, code, each) for s in subs]
    ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference=f"bench:subaccounts:refill:{round_}")
    print(len(subs))


if __name__ == "__main__":
    main(sys.argv[1:])
