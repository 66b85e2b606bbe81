"""The seeded simulation (issue 18, item 6): `python -m harness.simulation` runs harness/simulation, which
starts a private PostgreSQL and Redis and the stack exactly as `make run` does, drives random
customers through every flow while faults are injected, and checks at the end: the ledger check, every
balance equal to what the clients were acknowledged, every stream complete and in order, and every
answer within the rules (a client id sent again, a replayed signature, an expired quote and a
restricted key refused), the house's convert P&L and the cycle customer's returns (issue 25).

make test runs a short seed (SIMULATION_SEED, default 18; SIMULATION_MINUTES, default 1.0: the
shortest in which seed 18 meets every fault and every flow) through its command line, as a process;
the schedule's determinism is tested without a stack."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from decimal import ROUND_DOWN, Decimal

import pytest

from harness.simulation import cycles
from harness.simulation import plan as simulate
from tests.stack.test_faults import require_servers
from tests.support.stack import PYTHON, ROOT

MAKE_TEST_MINUTES = 1.0  # the run make test makes; the schedule test below shows it meets every kind of fault


def test_the_same_seed_gives_the_same_schedule_and_every_kind_of_fault():
    first = simulate.schedule(18, MAKE_TEST_MINUTES, 4)
    assert simulate.digest(*first) == simulate.digest(*simulate.schedule(18, MAKE_TEST_MINUTES, 4))
    assert simulate.digest(*first) != simulate.digest(*simulate.schedule(19, MAKE_TEST_MINUTES, 4))
    ops, faults = first
    assert {name for _, name in faults} == set(simulate.INFRA_FAULTS)  # a short run meets each kind
    assert {op.kind for op in ops} == set(simulate.WEIGHTS)  # and every flow
    # a client id sent again / a replay refers to an earlier operation with a client id
    by_n = {op.n: op for op in ops}
    for op in ops:
        if op.kind in ("duplicate", "replay"):
            assert by_n[op.params["of"]].kind in simulate.REPEATABLE
            assert 3.0 <= op.at - by_n[op.params["of"]].at <= 40.0


def test_the_cycle_customer_tries_every_cycle_of_the_pairs_and_its_plan_is_the_seeds():
    minimum = {"BTC": Decimal("0.0001"), "ETH": Decimal("0.001"), "USDT": Decimal(1), "PHP": Decimal(50)}
    pairs = {
        (s, t): (minimum[s], minimum[s] * 1000)
        for a, b in (("BTC", "PHP"), ("USDT", "PHP"), ("ETH", "USDT"), ("BTC", "USDT"))
        for s, t in ((a, b), (b, a))
    }
    trails = cycles.closed_trails(pairs)
    assert ("PHP", "USDT", "PHP") in trails  # 2-cycles
    assert ("PHP", "USDT", "BTC", "PHP") in trails  # triangles, both ways round
    assert ("PHP", "BTC", "USDT", "PHP") in trails
    assert ("PHP", "USDT", "ETH", "USDT", "BTC", "PHP") in trails  # longer, through a currency twice
    for path in trails:  # closed, each direction once, 2..CYCLE_MAX_LEGS legs
        legs = list(itertools.pairwise(path))
        assert path[0] == path[-1]
        assert len(set(legs)) == len(legs)
        assert 2 <= len(legs) <= cycles.CYCLE_MAX_LEGS
        assert set(legs) <= set(pairs)
    places = {"BTC": 8, "ETH": 8, "USDT": 6, "PHP": 2}
    plan = cycles.cycle_plan(18, pairs, places, 300)
    assert plan == cycles.cycle_plan(18, pairs, places, 300) != cycles.cycle_plan(19, pairs, places, 300)
    assert {path for path, _ in plan} == set(trails)  # a run meets every cycle
    for path, start in plan:  # 20 to 200 times the first pair's minimum
        assert 20 * minimum[path[0]] <= Decimal(start) <= 200 * minimum[path[0]]


def test_the_convert_pnl_check_refuses_an_order_paying_out_more_than_the_source_is_worth():
    market = Decimal("5200000")  # PHP per BTC before the spread
    # at the spread (20 bps, rounded down): the house gains 104 PHP
    assert cycles.order_pnl(Decimal("0.01"), Decimal("51896.00"), Decimal(0), market) == Decimal("104")
    assert not cycles.order_loses(Decimal("104"), 2)
    # one unit of the target's decimals more than the source's worth: rounding, allowed; two: a loss
    paid_out = cycles.order_pnl(Decimal("0.01"), Decimal("51999.99"), Decimal("0.02"), market)
    assert paid_out == Decimal("-0.01")
    assert not cycles.order_loses(paid_out, 2)
    assert cycles.order_loses(cycles.order_pnl(Decimal("0.01"), Decimal("51999.99"), Decimal("0.03"), market), 2)
    assert cycles.order_loses(paid_out, None)  # the target's decimals unknown: judged exactly


def _cycle_end(start: Decimal, prices: list[Decimal], spread_bps: int, places: list[int]) -> Decimal:
    """What a customer gets round a cycle: each leg at the market price less the spread, rounded down."""
    amount = start
    for price, n in zip(prices, places, strict=True):
        amount = (amount * price * (1 - Decimal(spread_bps) / 10000)).quantize(Decimal(1).scaleb(-n), ROUND_DOWN)
    return amount


def test_the_cycle_check_refuses_a_cycle_richer_than_the_market_moved():
    usdt_php, btc_usdt = Decimal("58.20"), Decimal("89500")
    places = [6, 8, 2]  # PHP -> USDT -> BTC -> PHP: the targets' decimals
    start = Decimal("10000.00")
    # One price per asset: the triangle's market prices multiply to 1; with the spreads the
    # customer ends poorer, at one snapshot (each leg's price the witness's).
    consistent = [1 / usdt_php, 1 / btc_usdt, usdt_php * btc_usdt]
    verdict = cycles.judge_cycle(start, _cycle_end(start, consistent, 20, places), consistent, consistent)
    assert verdict.one_snapshot
    assert verdict.ok
    assert verdict.bps < -55
    # Independent markets (issue 25, finding 1): BTC/PHP 2% above USDT/PHP x BTC/USDT - the
    # customer ends richer at one snapshot: refused.
    walked = [1 / usdt_php, 1 / btc_usdt, usdt_php * btc_usdt * Decimal("1.02")]
    verdict = cycles.judge_cycle(start, _cycle_end(start, walked, 20, places), walked, walked)
    assert verdict.one_snapshot
    assert not verdict.ok
    assert verdict.bps > 100
    assert verdict.gap == Decimal("1.02")
    # The market rose 2% (BTC in PHP and in USDT) between the second and third leg, the witness saw the
    # risen prices: the same gain is the market's movement, not an arbitrage of the house.
    risen = [1 / usdt_php, 1 / (btc_usdt * Decimal("1.02")), usdt_php * btc_usdt * Decimal("1.02")]
    legs = [1 / usdt_php, 1 / btc_usdt, risen[2]]
    verdict = cycles.judge_cycle(start, _cycle_end(start, legs, 20, places), legs, risen)
    assert not verdict.one_snapshot
    assert verdict.bps > 100
    assert verdict.ok
    # ... but not more than it moved: the witness saw the price source's arbitrage as well.
    arbitrage = [1 / usdt_php, 1 / (btc_usdt * Decimal("1.02")), usdt_php * btc_usdt * Decimal("1.0404")]
    legs = [1 / usdt_php, 1 / btc_usdt, arbitrage[2]]
    verdict = cycles.judge_cycle(start, _cycle_end(start, legs, 20, places), legs, arbitrage)
    assert not verdict.ok


def _simulate(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m harness.simulation ARGS` from the project root, as an operator runs it."""
    return subprocess.run(  # noqa: S603 - this interpreter, the project's own module
        [PYTHON, "-m", "harness.simulation", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_the_command_refuses_nonsense_arguments():
    for args in (("--seed", "1", "--minutes", "0"), ("--seed", "1", "--customers", "0"), ("--minutes", "1")):
        done = _simulate(*args)
        assert done.returncode == 2, done
        assert "usage: python -m harness.simulation" in done.stderr, done.stderr
    assert "--minutes must be positive and --customers at least 1" in _simulate("--seed", "1", "--minutes", "0").stderr


def test_the_simulation_is_no_command_of_the_service():
    """Tooling, not the product: production's settings install no harness app, so manage.py has no
    `simulate` (the harness's own command line runs it)."""
    done = subprocess.run(  # noqa: S603 - this interpreter, the project's manage.py
        [PYTHON, "manage.py", "help", "simulate"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "Unknown command: 'simulate'" in done.stderr, done.stderr


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_a_short_seeded_simulation_keeps_every_rule():
    require_servers()
    seed = int(os.environ.get("SIMULATION_SEED", "18"))
    minutes = os.environ.get("SIMULATION_MINUTES", str(MAKE_TEST_MINUTES))
    done = _simulate("--seed", str(seed), "--minutes", minutes, timeout=870)
    report = done.stdout
    sys.stdout.write(report)  # pytest -s shows the run
    if done.returncode != 0:
        pytest.fail(f"exit status {done.returncode}\n{report}\n{done.stderr[-3000:]}")
    assert "RESULT: ok" in report, report
    for check in ("ledger_check", "balances", "streams", "answers", "convert_pnl", "cycles"):
        assert f"ok     {check}:" in report, report
    completed = re.search(r"ok     cycles: (\d+) completed", report)
    assert completed, report
    assert int(completed.group(1)) >= 5, report  # the cycle customer went round, several times
    for fault in simulate.INFRA_FAULTS:
        assert fault in report.split("faults injected:")[1].split("\n")[0], report
