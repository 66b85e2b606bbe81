"""The replay memory's bookkeeping keys in the rate-limit storage (exchange/api/ratelimit.py), here
without Django so that tests, benchmarks and the chaos script can declare an emptied storage
complete the same way the service does."""

from __future__ import annotations

PREFIX = "LIMITS"  # the limits library's key prefix
EPOCH_KEY = "exchange/replay-memory-epoch"  # since when (ms, Redis's clock) every signature is remembered
SERVER_KEY = "exchange/replay-memory-server"  # the run id of the Redis server process that remembered them


def declare_complete(client) -> None:
    """On an emptied Redis database (a redis-py client of it): it has seen no signature, so its
    replay memory is complete from the beginning of time, in the server process that holds it now."""
    client.mset({f"{PREFIX}:{EPOCH_KEY}": 0, f"{PREFIX}:{SERVER_KEY}": client.info("server")["run_id"]})
