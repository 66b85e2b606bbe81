"""bench/streams' poster: argv `accounts-json rate seconds warmup out-path`; posts CHAIN_DEPOSITs round
robin over the accounts at `rate` per second, records the clock right after each COMMIT and writes
the records to `out-path` as JSON."""

import json
import sys
import time
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from accounts import ledger
    from accounts.models import SystemRole

    accounts = json.loads(argv[0])
    rate, seconds, warmup, out_path = float(argv[1]), float(argv[2]), float(argv[3]), argv[4]
    committed = []
    # First among the after-commit listeners: the clock right after COMMIT, before the relay publishes.
    ledger.after_commit_listeners.insert(0, lambda result: committed.append(time.time()))
    world = ledger.system_account_id(SystemRole.WORLD)
    amount = Decimal("0.001")
    records, postings = [], []
    start = time.time()
    end = start + warmup + seconds
    i = 0
    while time.time() < end:  # paced at `rate`; a poster that falls behind posts back to back
        pause = start + i / rate - time.time()
        if pause > 0:
            time.sleep(pause)
        account = accounts[i % len(accounts)]
        result = ledger.post(
            legs=ledger.move(world, account, "BTC", amount), kind="CHAIN_DEPOSIT", reference=f"bench-stream:{start}:{i}"
        )
        after = next(b for b in result.balances if b.account_id == account)
        records.append([account, str(after.free), committed[-1], committed[-1] < start + warmup])
        postings.append(result.posting_id)
        i += 1
    # A worker stays alive: give this process's relay the time to publish its last postings.
    from accounts.ledger.models import BalanceChange

    deadline = time.time() + 10
    while (
        time.time() < deadline
        and BalanceChange.objects.filter(posting_id__in=postings[-500:], published_at__isnull=True).exists()
    ):
        time.sleep(0.05)
    with open(out_path, "w") as f:
        json.dump({"records": records}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
