"""Weighted request limits per IP and per UID, and the 418 ban for clients that ignore a 429.

Counters live in the `limits` library's storage: Redis in the full stack, process memory in the
embedded default. Each counter is a fixed one-minute window (the `limits` item's key and expiry)
that starts at its first request; refused requests count too, so hammering keeps a client refused.
A client that sends another request after having been told 429 in the same window is banned:
2 minutes for a first offence, doubling per offence within the last 3 days, capped at 3 days.
Bans are rows of `exchange.RateLimitBan` (visible and liftable in the admin) mirrored into the
storage, which is what the request path reads.

One request costs one storage round trip: the ban check, both counters and, for a signed write,
the replay check of its signature are taken together (a Lua script on Redis; the same steps under
one lock in memory), because the gateway charges a request once it knows who is calling and the
signature has passed every other check.

Replay refusal never fails open (docs/security.md):
- storage unreachable: counting fails open (logged), but a signed write is refused with -1001;
- storage emptied (a Redis restart without persistence, a flush, a new embedded process): the
  storage keeps a "memory epoch" key, the time it started remembering signatures, written by the
  first request that finds it missing. A signed write whose timestamp is not clearly after that
  time (MEMORY_MARGIN_MS, covering the future tolerance and clocks of other processes) could have
  been accepted before the storage forgot it, so it is refused with -1021 (sign again with a fresh
  timestamp). This lasts a couple of seconds after a restart for honest clients.
- storage restarted with its data, or failed over to a replica (persistence restores the epoch, but
  an AOF written every second, or a replica behind its master, can still lose the last signatures
  remembered): every new connection to Redis compares the server's `run_id` (INFO) with the one
  recorded in the storage; when it differs, the memory epoch starts again now, before the
  connection's first command (`RestartWatch`).

The package, one module per concern:

- storage.py: the counters in the `limits` storage (Lua on Redis, a lock in memory), `counters()`;
- replay.py: the replay memory's epoch and margin, and the Redis restart watch;
- bans.py: the ban rows and their mirror in the storage, lifting and forgiving;
- charging.py: `charge()`, the gateway's one call per request, and the used-weight headers.
"""

import logging

from exchange.api.ratelimit.bans import (
    ban_duration_seconds,
    ban_key,
    forgive,
    rate_limit_ban_create,
    rate_limit_ban_lift,
)
from exchange.api.ratelimit.charging import (
    REFUSAL_WEIGHT,
    USED_UID_WEIGHT_HEADER,
    USED_WEIGHT_HEADER,
    apply_weight_headers,
    charge,
    signature_key,
)
from exchange.api.ratelimit.replay import MEMORY_EPOCH_KEY, MEMORY_MARGIN_MS, MEMORY_SERVER_KEY, RestartWatch
from exchange.api.ratelimit.storage import (
    STORAGE_ERRORS,
    STORAGE_OUTAGE,
    Counters,
    Taken,
    counters,
    start_memory_epoch,
    storage,
)

logger = logging.getLogger(__name__)  # the one logger of the package's modules

__all__ = [
    "MEMORY_EPOCH_KEY",
    "MEMORY_MARGIN_MS",
    "MEMORY_SERVER_KEY",
    "REFUSAL_WEIGHT",
    "STORAGE_ERRORS",
    "STORAGE_OUTAGE",
    "USED_UID_WEIGHT_HEADER",
    "USED_WEIGHT_HEADER",
    "Counters",
    "RestartWatch",
    "Taken",
    "apply_weight_headers",
    "ban_duration_seconds",
    "ban_key",
    "charge",
    "counters",
    "forgive",
    "rate_limit_ban_create",
    "rate_limit_ban_lift",
    "signature_key",
    "start_memory_epoch",
    "storage",
]
