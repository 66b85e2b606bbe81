"""`python -m harness.lab.bench_accounts COUNT`: the host fault run's funded accounts for its
throughput measure (PHP, pairs that share no row lock): COUNT users with a ledger account, 1,000,000
PHP each from the house's equity in one posting, and an API key each. Run with the lab stack's
environment (hostfault.py); prints `[[email, api key, secret], ...]` as JSON on its last line.

It is the one module of the harness that writes through the product's own code (the ledger and the
key service) instead of HTTP or SQL: tests/test_dependencies.py lists what it imports."""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal

EACH = Decimal(1_000_000)


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")
    import django

    django.setup()
    from django.contrib.auth.hashers import make_password
    from django.db import transaction

    from accounts import ledger, services
    from accounts.ledger.models import BusinessType
    from accounts.models import LedgerAccount, SystemRole, User

    count = int(argv[0])
    # make_password(None): an unusable password ("!" and random text); the accounts sign with keys only.
    with transaction.atomic():
        User.objects.bulk_create([User(email=f"lab{i}@bench.lab", password=make_password(None)) for i in range(count)])
        users = list(User.objects.filter(email__endswith="@bench.lab").order_by("id"))
        LedgerAccount.objects.bulk_create([LedgerAccount(user=u) for u in users], ignore_conflicts=True)
        legs = [ledger.Leg(ledger.system_account_id(SystemRole.EQUITY), "PHP", -EACH * len(users))]
        legs += [ledger.Leg(u.pk, "PHP", EACH) for u in users]
        ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference="lab:bench:funding")
        keys = [services.api_key_create(user=u, name="lab") for u in users]
    sys.stdout.write(json.dumps([[u.email, k.api_key.key, k.secret] for u, k in zip(users, keys, strict=True)]) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
