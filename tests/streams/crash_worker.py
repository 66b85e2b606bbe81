"""Run by test_crash.py as a separate process: commit one deposit and die by SIGKILL right after the
commit, before the relay's fast path (the next after-commit listener) can publish it.

    python -m tests.streams.crash_worker <account id> <amount> <reference>     # from the project root

Settings come from the environment (DJANGO_SETTINGS_MODULE, DATABASE_URL pointing at the test
database, REDIS_URL). Exit status 3: the process was not killed (it should have been); 4: the relay's
listener was not registered, so the kill would prove nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from decimal import Decimal


def main(account_id: int, amount: str, reference: str) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.test")
    import django

    django.setup()

    from accounts import ledger
    from accounts.ledger.posting import after_commit_listeners
    from accounts.models import SystemRole
    from streams.relay import fast_path_enabled, publish_posting

    if publish_posting not in after_commit_listeners or not fast_path_enabled():
        return 4

    def die(result) -> None:
        sys.stdout.write(f"committed {result.posting_id}\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    after_commit_listeners.insert(0, die)
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, account_id, "BTC", Decimal(amount)), kind="CHAIN_DEPOSIT", reference=reference)
    return 3


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
