"""The full stack under faults (issue 16, item 4): harness/chaos's driver starts a private
PostgreSQL cluster and a private Redis (AOF), the stack exactly as `make run` does (harness:
nginx, granian, Daphne, Celery worker and beat), runs signed transfer clients, websockets, withdrawals
and fund collections through nginx, and meanwhile restarts Redis, restarts PostgreSQL and SIGKILLs
the Celery worker's pool children and, once, the whole worker. This test runs it and asserts on its
result: every rule the driver checks holds (no 500 or other 5xx but 503 -1001, no hung request, a
200 soon after every fault, the ledger check, every transfer once, every unknown outcome resolved,
every withdrawal and collection final and settled once, every websocket's events exactly once and in
order), and the faults really happened.

CHAOS_SEED picks the fault order and timing (default 16); the report is printed (pytest -s shows it).
Fails when PostgreSQL's binaries or redis-server are missing (`make services` installs them).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.chaos.run import run as run_chaos


def _missing_services() -> str | None:
    if not any(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        return "no PostgreSQL under /usr/lib/postgresql (make services installs it)"
    if shutil.which("redis-server") is None:
        return "no redis-server (make services installs it)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "no runuser to run PostgreSQL as the postgres user"
    return None


def require_servers() -> None:
    """Fail (never skip) without the servers' binaries: `make services` installs them."""
    missing = _missing_services()
    if missing is not None:
        pytest.fail(missing, pytrace=False)


pytestmark = [pytest.mark.timeout(600), pytest.mark.soak]


def test_the_full_stack_keeps_its_rules_through_redis_postgres_and_worker_faults():
    require_servers()
    result = run_chaos(seed=int(os.environ.get("CHAOS_SEED", "16")))

    assert result.problems == [], result.report
    assert sorted(f.name for f in result.faults) == [
        "postgres_restart",
        "redis_restart",
        "worker_children_kill",
        "worker_kill",
    ]
    checks = {check.name: check for check in result.checks}
    assert sorted(checks) == ["collections", "ledger_check", "transfers", "websockets", "withdrawals"]
    assert all(check.ok for check in checks.values()), result.report

    # The faults happened: clients were refused (503 -1001, nothing executed) while Redis and
    # PostgreSQL were away, and nothing but 200 or 503 -1001 came back from any of them.
    for fault in result.faults:
        assert fault.end > fault.start, fault.name
        during = [a for a in result.answers if fault.start <= a.ended <= fault.end]
        assert not [a for a in result.answers if a.breaks_a_rule], result.report
        if fault.name in ("redis_restart", "postgres_restart"):
            assert any((a.status, a.code) == (503, -1001) for a in during), (fault.name, result.report)
    # The worker died with work in its hands, and the Supervisor started it again; all of it settled.
    killed = [f for f in result.faults if f.name in ("worker_children_kill", "worker_kill")]
    assert any(any(f.in_flight.values()) for f in killed), result.report
    assert all(f.settled_after is not None for f in killed), result.report
    assert result.restarts["worker"] >= 1
    # Load went through: most transfers succeeded, and the websockets that stayed counted every posting.
    transfers = [a for a in result.answers if a.kind == "transfer"]
    assert sum(a.status == 200 for a in transfers) > len(transfers) / 2
    assert len([s for s in result.segments if s.closed is None]) == 3
