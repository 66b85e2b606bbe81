"""bench/convert's in-process timings: argv `domain first plan-json`; 45 get-quote + accept pairs one at
a time on 16 accounts from `first`; prints `name value` lines (ms per call, wall and CPU) and the
number of conversions."""

import json
import sys
import time
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from accounts.models import User
    from convert import services

    first, plan = int(argv[1]), json.loads(argv[2])
    users = list(User.objects.filter(email__endswith="@" + argv[0]).order_by("id")[first : first + 16])
    totals = {"quote": 0.0, "quote_cpu": 0.0, "accept": 0.0, "accept_cpu": 0.0}
    for i in range(45):  # every (account, pair) at most once: the per-pair quote interval never refuses
        source, target, amount = plan[(i // len(users)) % len(plan)]
        user = users[i % len(users)]
        began, cpu = time.perf_counter(), time.process_time()
        quote = services.quote_create(user=user, source_code=source, target_code=target, source_amount=Decimal(amount))
        quoted, quoted_cpu = time.perf_counter(), time.process_time()
        services.quote_accept(user=user, quote_id=quote.quote_id)
        if i >= 5:
            totals["quote"] += quoted - began
            totals["quote_cpu"] += quoted_cpu - cpu
            totals["accept"] += time.perf_counter() - quoted
            totals["accept_cpu"] += time.process_time() - quoted_cpu
    for name, seconds in totals.items():
        print(f"{name} {seconds / 40 * 1000:.1f}")
    print("conversions 45")


if __name__ == "__main__":
    main(sys.argv[1:])
