"""bench/stream_fanout's poster: argv `account rate seconds warmup tag out-path`; prints `ready`, waits
for a line on stdin, posts CHAIN_DEPOSITs to the account at `rate` per second, each stamped with its
commit time, and writes the records to `out-path` as JSON."""

import json
import sys
import time
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from accounts import ledger
    from accounts.models import SystemRole
    from streams import relay

    account = int(argv[0])
    rate, seconds, warmup = float(argv[1]), float(argv[2]), float(argv[3])
    tag, out_path = argv[4], argv[5]
    committed = []
    # First among the after-commit listeners: the clock right after COMMIT, before the relay publishes.
    ledger.after_commit_listeners.insert(0, lambda result: committed.append(time.time()))
    world = ledger.system_account_id(SystemRole.WORLD)
    amount = Decimal("0.001")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()  # every poster and client is ready
    records = []
    start = time.time()
    end = start + warmup + seconds
    i = 0
    while time.time() < end:  # paced at `rate`; a poster that falls behind posts back to back
        pause = start + i / rate - time.time()
        if pause > 0:
            time.sleep(pause)
        result = ledger.post(
            legs=ledger.move(world, account, "BTC", amount), kind="CHAIN_DEPOSIT", reference=f"fanout-bench:{tag}:{i}"
        )
        after = next(b for b in result.balances if b.account_id == account)
        records.append([after.seq, str(after.free), committed[-1], committed[-1] < start + warmup])
        i += 1
    relay.drain(10)  # a worker stays alive: its relay publishes its last postings
    with open(out_path, "w") as f:
        json.dump({"records": records, "started": start}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
