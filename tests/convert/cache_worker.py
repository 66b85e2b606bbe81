"""Run by test_reference_cache.py as another process of the service (tests/support/other_process.py):
it quotes through the convert services with its own per-process caches, and says when a change made
by the test's process reached it.

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
from decimal import Decimal


def main(account_id: int) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.test")
    import django

    django.setup()

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import User
    from convert import errors, services
    from tests.support.other_process import serve

    user = User.objects.get(pk=account_id)

    def quote() -> None:
        services.quote_create(user=user, source_code="PHP", target_code="BTC", source_amount=Decimal("100"))

    def warm() -> int:
        quote()
        with CaptureQueriesContext(connection) as captured:
            quote()
        return len(captured.captured_queries)

    def look() -> tuple[str, str] | None:
        try:
            quote()
        except errors.ConvertError as error:
            return "refused", error.msg
        return None

    return serve(warm=warm, look=look)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
