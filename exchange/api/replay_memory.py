"""The replay memory's bookkeeping keys in the rate-limit storage (exchange/api/ratelimit/), here
without Django so that tests, benchmarks and the chaos script can declare an emptied storage
complete the same way the service does."""

from __future__ import annotations

PREFIX = "LIMITS"  # the limits library's key prefix
EPOCH_KEY = "exchange/replay-memory-epoch"  # since when (ms, Redis's clock) every signature is remembered
SERVER_KEY = "exchange/replay-memory-server"  # the run id of the Redis server process that remembered them


def record(client, epoch_ms: int, prefix: str = PREFIX) -> None:
    """Declare (a redis-py client of the storage's database) that it has remembered every signature
    since `epoch_ms`, in the Redis server process that holds it now (its run id, recorded with it)."""
    run_id = client.info("server")["run_id"]
    client.mset({f"{prefix}:{EPOCH_KEY}": epoch_ms, f"{prefix}:{SERVER_KEY}": run_id})


def declare_complete(client) -> None:
    """On an emptied Redis database: it has seen no signature, so its replay memory is complete
    from the beginning of time."""
    record(client, 0)
