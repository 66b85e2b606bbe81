"""bench/transfers' in-process timings: argv `domain`; 40 transfers one at a time between the domain's
first four accounts, with and without the ledger's after-commit listeners; prints `name value` lines
(ms per transfer, wall and CPU)."""

import sys
import time
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from accounts.ledger import posting
    from accounts.models import User
    from wallet.transfers import services

    users = list(User.objects.filter(email__endswith="@" + argv[0]).order_by("id")[:4])

    def one(i):
        services.transfer_create(
            sender=users[i % 2], asset_code="PHP", target_address=users[2 + i % 2].email, amount=Decimal(1)
        )

    listeners = list(posting.after_commit_listeners)
    for i in range(5):
        one(i)
    for label, attached in (("with_listeners", listeners), ("without_listeners", [])):
        posting.after_commit_listeners[:] = attached
        began, cpu = time.perf_counter(), time.process_time()
        for i in range(40):
            one(i)
        print(f"{label} {(time.perf_counter() - began) / 40 * 1000:.1f}")
        print(f"{label}_cpu {(time.process_time() - cpu) / 40 * 1000:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
