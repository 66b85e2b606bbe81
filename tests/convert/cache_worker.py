"""Run by test_reference_cache.py as another process of the service: it quotes through the convert
services with its own per-process caches, and says when a change made by the test's process reached
it.

    python -m tests.convert.cache_worker <account id>     # from the project root

Settings come from the environment (DJANGO_SETTINGS_MODULE, DATABASE_URL pointing at the test
database, REDIS_URL, REFERENCE_CACHE_SECONDS long enough that only the invalidation can deliver a
change within the bound). Commands on stdin, one answer line each on stdout:

- `warm`: two quotes; answers `warm <ORM statements of the second quote>` (0: its caches are in use);
- `watch <seconds>`: quotes 100 PHP -> BTC in a loop until one is refused or `seconds` pass;
  answers `refused <time.time() of that quote's start> <message>` or `unchanged <quotes made>`.
"""

from __future__ import annotations

import os
import sys
import time
from decimal import Decimal


def main(account_id: int) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.test")
    import django

    django.setup()

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import User
    from convert import errors, services

    user = User.objects.get(pk=account_id)

    def quote() -> None:
        services.quote_create(user=user, source_code="PHP", target_code="BTC", source_amount=Decimal("100"))

    for line in sys.stdin:
        command, *args = line.split()
        if command == "warm":
            quote()
            with CaptureQueriesContext(connection) as captured:
                quote()
            answer = f"warm {len(captured.captured_queries)}"
        elif command == "watch":
            deadline, made, answer = time.monotonic() + float(args[0]), 0, ""
            while time.monotonic() < deadline:
                started = time.time()
                try:
                    quote()
                except errors.ConvertError as error:
                    answer = f"refused {started!r} {error.msg}"
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
    sys.exit(main(int(sys.argv[1])))
