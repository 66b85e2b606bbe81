"""The seeded simulation (issue 18, item 6): `manage.py simulate` runs scripts/simulate.py, which
starts a private PostgreSQL and Redis and the stack exactly as `make run` does, drives random
customers through every flow while faults are injected, and checks at the end: the ledger check, every
balance equal to what the clients were acknowledged, every stream complete and in order, and every
answer within the rules (a client id sent again, a replayed signature, an expired quote and a
restricted key refused).

make test runs a short seed (SIMULATION_SEED, default 18; SIMULATION_MINUTES, default 1.5) through
the management command; the schedule's determinism is tested without a stack."""

from __future__ import annotations

import io
import os
import sys

import pytest
from django.core.management import CommandError, call_command

from scripts import simulate
from tests.stack.test_faults import _missing_services


def test_the_same_seed_gives_the_same_schedule_and_every_kind_of_fault():
    first = simulate.schedule(18, 1.5, 4)
    assert simulate.digest(*first) == simulate.digest(*simulate.schedule(18, 1.5, 4))
    assert simulate.digest(*first) != simulate.digest(*simulate.schedule(19, 1.5, 4))
    ops, faults = first
    assert {name for _, name in faults} == set(simulate.INFRA_FAULTS)  # a short run meets each kind
    assert {op.kind for op in ops} == set(simulate.WEIGHTS)  # and every flow
    # a client id sent again / a replay refers to an earlier operation with a client id
    by_n = {op.n: op for op in ops}
    for op in ops:
        if op.kind in ("duplicate", "replay"):
            assert by_n[op.params["of"]].kind in simulate.REPEATABLE
            assert 3.0 <= op.at - by_n[op.params["of"]].at <= 40.0


def test_the_command_refuses_nonsense_arguments():
    with pytest.raises(CommandError):
        call_command("simulate", "--seed", "1", "--minutes", "0")


@pytest.mark.timeout(900)
@pytest.mark.skipif(_missing_services() is not None, reason=_missing_services() or "")
def test_a_short_seeded_simulation_keeps_every_rule():
    out = io.StringIO()
    seed = int(os.environ.get("SIMULATION_SEED", "18"))
    minutes = os.environ.get("SIMULATION_MINUTES", "1.5")
    try:
        call_command("simulate", "--seed", str(seed), "--minutes", minutes, stdout=out)
    except CommandError:
        pytest.fail(out.getvalue())
    report = out.getvalue()
    sys.stdout.write(report)  # pytest -s shows the run
    assert "RESULT: ok" in report, report
    for check in ("ledger_check", "balances", "streams", "answers"):
        assert f"ok     {check}:" in report, report
    for fault in simulate.INFRA_FAULTS:
        assert fault in report.split("faults injected:")[1].split("\n")[0], report
