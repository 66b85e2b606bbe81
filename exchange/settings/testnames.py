"""The names of a test run's private resources, per pytest-xdist worker (tests/README.md, "Isolation").

Every test process (one per xdist worker, PYTEST_XDIST_WORKER=gwN, or the only one) has its own test
database (pytest-django's `_gwN` suffix), its own block of Redis databases and its own names for the
databases its modules create. Pure functions of the environment: the test settings
(exchange/settings/test.py) and tests/support/stack.py both ask here, and a process a test starts with
PYTEST_XDIST_WORKER in its environment gets the same answers.

Redis: TEST_REDIS_DBS is the list of database numbers the run may use (default: REDIS_URL's number
and every lower one, 15, 14, ..., 0). Worker N takes the REDIS_DBS_PER_WORKER numbers from position
N * REDIS_DBS_PER_WORKER: the first is its REDIS_URL (the tests' storage and channel layer), the
others serve the modules that start processes (REDIS_PURPOSES). A Redis with 16 databases holds
four workers; scripts/services.sh starts the test Redis with 64.
"""

from __future__ import annotations

import os

# What each worker's block of Redis databases is for, in order.
REDIS_PURPOSES = ("test", "fullstack", "crash", "pool")
REDIS_DBS_PER_WORKER = len(REDIS_PURPOSES)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"


class NamingError(RuntimeError):
    """The environment does not give this worker a resource of its own."""


def worker() -> str:
    """`gwN` under pytest-xdist, else ""."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def worker_index() -> int:
    name = worker()
    return int(name.removeprefix("gw")) if name else 0


def suffix() -> str:
    """`_gwN` under pytest-xdist (as pytest-django names the test database), else ""."""
    name = worker()
    return f"_{name}" if name else ""


def database_name(default: str, variable: str | None = None) -> str:
    """A database name of this worker's: the environment's `variable` (an override, e.g.
    FULLSTACK_DATABASE_NAME, so that runs sharing one PostgreSQL do not collide) or `default`,
    with the worker's suffix."""
    base = os.environ.get(variable, "") if variable else ""
    return f"{base or default}{suffix()}"


def redis_dbs() -> list[int]:
    """The Redis database numbers the run may use (TEST_REDIS_DBS, or REDIS_URL's and every lower one)."""
    listed = [item.strip() for item in os.environ.get("TEST_REDIS_DBS", "").split(",") if item.strip()]
    if listed:
        return [int(item) for item in listed]
    top = int(os.environ.get("REDIS_URL", DEFAULT_REDIS_URL).rsplit("/", 1)[1] or 0)
    return list(range(top, -1, -1))


def redis_db(purpose: str) -> int:
    """This worker's Redis database for `purpose` (one of REDIS_PURPOSES). `<PURPOSE>_REDIS_DB`
    (e.g. FULLSTACK_REDIS_DB) overrides it outside xdist, or for every worker as a comma-separated list."""
    index = worker_index()
    override = os.environ.get(f"{purpose.upper()}_REDIS_DB", "") if purpose != "test" else ""
    if override:
        numbers = [int(item) for item in override.split(",") if item.strip()]
        if index >= len(numbers):
            raise NamingError(f"{purpose.upper()}_REDIS_DB={override}: no database for worker {worker() or 'gw0'}")
        return numbers[index]
    dbs = redis_dbs()
    position = index * REDIS_DBS_PER_WORKER + REDIS_PURPOSES.index(purpose)
    if position >= len(dbs):
        raise NamingError(
            f"worker {worker() or 'gw0'} needs Redis databases {REDIS_DBS_PER_WORKER * index}..."
            f"{REDIS_DBS_PER_WORKER * (index + 1) - 1} of TEST_REDIS_DBS ({dbs}): fewer workers, a REDIS_URL "
            "with a higher database number, or a Redis started with more databases (scripts/services.sh)"
        )
    return dbs[position]


def pin() -> None:
    """Put the run's list of Redis databases in the environment (when it was the default): a process
    a test starts inherits it with PYTEST_XDIST_WORKER, whatever REDIS_URL it is given, and so
    lands in the same database as its test (not in a block counted from the worker's own number)."""
    os.environ.setdefault("TEST_REDIS_DBS", ",".join(str(number) for number in redis_dbs()))


def redis_url() -> str:
    """This worker's REDIS_URL: REDIS_URL's server with the worker's "test" database."""
    server = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL).rsplit("/", 1)[0]
    return f"{server}/{redis_db('test')}"
