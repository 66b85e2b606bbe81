"""Run by test_transfer_reference_cache.py as another process of the service (tests/support/
other_process.py): it sends transfers through the transfer service with its own per-process caches
(the asset, its transfer fee, the sender's limit tier), and says when a change made by the test's
process reached it.

    python -m tests.wallet.transfer_cache_worker <sender id> <recipient e-mail>     # from the project root

Commands on stdin, one answer line each on stdout:

- `warm`: two transfers of 1 PHP; answers `warm <fee of the second>`;
- `watch <seconds>`: transfers of 1 PHP in a loop until one's fee differs from the first one's, one
  is refused, or `seconds` pass; answers `fee <time.time() of that transfer's start> <its fee>`,
  `refused <time.time() of its start> <code> <message>` or `unchanged <transfers made>`.
"""

from __future__ import annotations

import os
import sys
import time
from decimal import Decimal


def main(sender_id: int, recipient: str) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.test")
    import django

    django.setup()

    from accounts.models import User
    from exchange.api.errors import ExchangeError
    from wallet.transfers import services

    sender = User.objects.get(pk=sender_id)

    def fee_of_a_transfer() -> Decimal:
        return services.transfer_create(
            sender=sender, asset_code="PHP", target_address=recipient, amount=Decimal(1)
        ).fee

    for line in sys.stdin:
        command, *args = line.split()
        if command == "warm":
            fee_of_a_transfer()
            answer = f"warm {fee_of_a_transfer()}"
        elif command == "watch":
            deadline, made, answer, first = time.monotonic() + float(args[0]), 0, "", None
            while time.monotonic() < deadline:
                started = time.time()
                try:
                    fee = fee_of_a_transfer()
                except ExchangeError as error:
                    answer = f"refused {started!r} {error.code} {error.msg}"
                    break
                first = fee if first is None else first
                if fee != first:
                    answer = f"fee {started!r} {fee}"
                    break
                made += 1
                time.sleep(0.005)
            answer = answer or f"unchanged {made}"
        else:
            answer = f"unknown {command}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
