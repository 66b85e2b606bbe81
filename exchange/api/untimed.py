"""Signed writes without a timestamp (issue 34, finding 8): their signature is spent the moment the
gateway has verified it, whatever the request then ends in.

A timed signature stops being valid when its timestamp leaves the window, so a request refused by a
check after the signature (a disabled key, the IP list, a limit, a ban) may keep its signature for
a retry: a replay after the window is refused -1021. An untimed one (`EndpointAuth.timestamp_optional`,
only the collect call) never expires: refused and replayed later, once the key is enabled again, the
address added or the minute over, it would run. So the first time its signature verifies, it is
recorded, before any other check, and every later request with it is a replay (-1022):

- in the database (`UntimedSignature`, unique per key and signature), for ever: it outlives a Redis
  restart, a flush and the embedded process, and holds on PostgreSQL and SQLite alike;
- in front of it, in the rate-limit storage for a day (one SET NX), so that a captured request
  resent in a loop is refused without a database write each time. The storage is only a cache: when
  it is unreachable the database answers alone, and when the database is unreachable the request is
  refused (never run unrecorded).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from exchange.api.errors import SignatureReplayed
from exchange.api.ratelimit import STORAGE_ERRORS, STORAGE_OUTAGE, counters, signature_key

CACHE_SECONDS = 24 * 3600


def spend_untimed_signature(api_key: str, signature: str) -> None:
    """Record `signature` (lower-case hex) of `api_key` as spent, or refuse it (-1022) if it was."""
    from exchange.api.models import UntimedSignature  # the models load after the gateway's modules

    try:
        new_here = counters().remember(signature_key(api_key, signature), CACHE_SECONDS)
    except STORAGE_ERRORS as exc:
        STORAGE_OUTAGE.failed(exc)
        new_here = True  # the database decides
    if not new_here:
        raise SignatureReplayed()
    try:
        with transaction.atomic():
            UntimedSignature.objects.create(api_key=api_key, signature=signature)
    except IntegrityError:
        raise SignatureReplayed() from None
