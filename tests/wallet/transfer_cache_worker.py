"""Run by test_transfer_reference_cache.py as another process of the service (tests/support/
other_process.py): it sends transfers through the transfer service with its own per-process caches
(the asset, its transfer fee, the sender's limit tier), and says when a change made by the test's
process reached it.

    python -m tests.wallet.transfer_cache_worker <sender id> <recipient e-mail>     # from the project root

Commands on stdin, one answer line each on stdout:

- `warm`: two transfers of 1 PHP; answers `warm <fee of the second>`;
- `watch <seconds>`: transfers of 1 PHP in a loop until one's fee differs from the warm-up's, one is
  refused, or `seconds` pass; answers `fee <time.time() of that transfer's start> <its fee>`,
  `refused <time.time() of its start> <code> <message>` or `unchanged <transfers made>`.
"""

from __future__ import annotations

import os
import sys
from decimal import Decimal


def main(sender_id: int, recipient: str) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.test")
    import django

    django.setup()

    from accounts.models import User
    from exchange.api.errors import ExchangeError
    from tests.support.other_process import serve
    from wallet.transfers import services

    sender = User.objects.get(pk=sender_id)
    warmed: list[Decimal] = []

    def fee_of_a_transfer() -> Decimal:
        return services.transfer_create(
            sender=sender, asset_code="PHP", target_address=recipient, amount=Decimal(1)
        ).fee

    def warm() -> Decimal:
        fee_of_a_transfer()
        warmed.append(fee_of_a_transfer())
        return warmed[-1]

    def look() -> tuple[str, str] | None:
        try:
            fee = fee_of_a_transfer()
        except ExchangeError as error:
            return "refused", f"{error.code} {error.msg}"
        return ("fee", str(fee)) if fee != warmed[-1] else None

    return serve(warm=warm, look=look)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
