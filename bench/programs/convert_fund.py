"""bench/convert's funds: argv `domain CODE=amount ...`; gives every account of the domain each amount
in one posting."""

import sys
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from accounts import ledger
    from accounts.ledger.models import BusinessType
    from accounts.models import SystemRole, User

    domain, funds = argv[0], dict(arg.split("=") for arg in argv[1:])
    users = list(User.objects.filter(email__endswith="@" + domain).order_by("id"))
    equity = ledger.system_account_id(SystemRole.EQUITY)
    legs = []
    for code, amount in funds.items():
        each = Decimal(amount)
        legs += [ledger.Leg(equity, code, -each * len(users))] + [ledger.Leg(u.pk, code, each) for u in users]
    ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference="bench:convert:funding")


if __name__ == "__main__":
    main(sys.argv[1:])
