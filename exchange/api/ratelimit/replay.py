"""The replay memory's epoch: the time from which the storage remembers every signature, the margin a
signed write must clear, and the Redis connect hook that starts the epoch again when another server
process holds the data (`RestartWatch`). The check itself runs with the counters (storage.py)."""

from __future__ import annotations

import logging

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from exchange.api import replay_memory

# The package's records keep one name (exchange.api.ratelimit), whichever of its modules logs.
logger = logging.getLogger(__package__)

# Signatures are not checked against a storage that may have forgotten them: a signed write is
# refused unless its timestamp is at least this long after the storage's memory epoch.
MEMORY_MARGIN_MS = 2000
MEMORY_EPOCH_KEY = replay_memory.EPOCH_KEY

# Redis's clock in milliseconds, as text, from `local now = redis.call('TIME')` (one clock for every process).
REDIS_NOW_MS = "tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))"


# KEYS: the recorded server run id, the memory epoch; ARGV: this server's run id. Returns 0 (same server),
# 1 (no epoch either: the storage is new or was emptied, and its first request starts the epoch) or
# 2 (another server than the one recorded holds the data, or an epoch without a recorded server -
# written by an older version, or its run id lost with the last second of an AOF: the memory epoch
# starts now). Whoever empties the storage declares it complete with both keys (replay_memory).
_RESTART_LUA = """
local known = redis.call('GET', KEYS[1])
if known == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
if not known and redis.call('EXISTS', KEYS[2]) == 0 then return 1 end
local now = redis.call('TIME')
redis.call('SET', KEYS[2], NOW_MS)
return 2
""".replace("NOW_MS", REDIS_NOW_MS)
MEMORY_SERVER_KEY = replay_memory.SERVER_KEY


class RestartWatch:
    """redis-py's connect hook (`redis_connect_func`) for the limits storage: after the handshake,
    before the connection's first command, it reads the server's run id and, if the storage's data
    was last written by another server process (a restart that restored its AOF or RDB, a replica
    promoted), starts the memory epoch again. Every connection is new after a restart, so no
    signed write is checked against a replay memory that may have lost its last entries."""

    def __init__(self) -> None:
        self.keys: list[str] = []  # the prefixed MEMORY_SERVER_KEY and MEMORY_EPOCH_KEY

    def on_connect(self, connection) -> None:
        connection.on_connect()
        try:
            restarted, run_id = self._check(connection)
        except RedisError:
            raise
        except Exception as exc:
            # Anything else would escape as a 500 and leave the unchecked connection in the pool:
            # redis-py drops a connection whose hook raises one of its own errors.
            raise RedisConnectionError(f"replay memory check failed: {type(exc).__name__}: {exc}") from exc
        if restarted:
            logger.warning(
                "Rate-limit storage: another Redis server process (run id %s) holds the data; the replay "
                "memory starts again now (signed writes signed before it are refused -1021)",
                run_id,
            )

    def _check(self, connection) -> tuple[bool, str]:
        connection.send_command("INFO", "server")
        info = connection.read_response()
        info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
        run_id = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("run_id:")), "")
        if not run_id:
            raise RedisConnectionError("the server's INFO has no run_id")
        connection.send_command("EVAL", _RESTART_LUA, len(self.keys), *self.keys, run_id)
        return connection.read_response() == 2, run_id


START_EPOCH_LUA = """
local now = redis.call('TIME')
return redis.call('SET', KEYS[1], NOW_MS, 'NX')
""".replace("NOW_MS", REDIS_NOW_MS)
