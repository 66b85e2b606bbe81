"""bench/streams' phase 4: argv `accounts-json count rounds`; the process's CPU ms per posting with and
without the ledger's after-commit listeners, nobody listening and every account's group with a
member; prints the medians as JSON."""

import json
import statistics
import sys
import time
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from accounts import ledger
    from accounts.ledger import posting
    from accounts.models import SystemRole
    from streams import relay

    accounts = json.loads(argv[0])
    count, rounds = int(argv[1]), int(argv[2])
    world = ledger.system_account_id(SystemRole.WORLD)
    listeners = list(posting.after_commit_listeners)
    layer = get_channel_layer()
    member = {a: f"specific.publisherbench!{a}" for a in accounts}
    run = time.time()

    def postings(tag):
        for i in range(count):
            ledger.post(
                legs=ledger.move(world, accounts[i % len(accounts)], "BTC", Decimal("0.00000001")),
                kind="CHAIN_DEPOSIT",
                reference=f"publisher-bench:{run}:{tag}:{i}",
            )
        assert relay.drain(30), "the publisher did not finish"

    async def members(join):
        for account, channel in member.items():
            change = layer.group_add if join else layer.group_discard
            await change(relay.account_group(account), channel)
        if not join:
            await layer.connection(0).delete(layer.prefix + "specific.publisherbench!")

    out = {}
    for listened in (False, True):
        if listened:
            async_to_sync(members)(True)
        postings(f"warm:{listened}")
        cpu = {True: [], False: []}
        for n in range(rounds):
            for attached in (True, False):
                posting.after_commit_listeners[:] = listeners if attached else []
                began = time.process_time()
                postings(f"{listened}:{n}:{attached}")
                cpu[attached].append((time.process_time() - began) / count * 1000)
        posting.after_commit_listeners[:] = listeners
        if listened:
            async_to_sync(members)(False)
        with_, without = statistics.median(cpu[True]), statistics.median(cpu[False])
        out["listened" if listened else "unlistened"] = {"with": with_, "without": without}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
