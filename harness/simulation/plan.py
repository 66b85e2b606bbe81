"""The simulation's schedule, a function of the seed alone: operations at Poisson-distributed times
and the infrastructure faults; and the paths it calls."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field

from harness.simulation.moves import _amount

OPS_PER_SECOND = 5.0
WEIGHTS = {
    "transfer": 26,
    "deposit": 10,
    "withdrawal": 8,
    "convert": 12,
    "universal": 10,
    "sub_to_master": 6,
    "collect": 4,
    "key_change": 2,
    "duplicate": 6,
    "replay": 6,
    "quote_expiry": 2,
}
INFRA_FAULTS = ("worker_kill", "worker_children_kill", "redis_restart", "postgres_restart", "connections_dropped")
FIRST_FAULT_SECONDS = 8.0
FAULT_GAP_SECONDS = (12.0, 30.0)
QUIET_END_SECONDS = 8.0  # no fault starts this close to the end of the load
SETTLE_SECONDS = 180.0
FOREIGN_IP = "198.51.100.7"  # TEST-NET-2: never this driver
REPEATABLE = ("transfer", "universal", "sub_to_master", "withdrawal", "collect")
# (coin, network, amount range, decimal places): deposits stay below the travel rule's threshold
DEPOSITS = [("USDT", "TRX", (5, 200), 2), ("ETH", "ETH", (0.01, 0.2), 4), ("USDT", "ETH", (5, 100), 2)]
WITHDRAWALS = [("ETH", "ETH", (0.01, 0.05), 4), ("USDT", "TRX", (10, 60), 2)]
TRANSFERS = [("USDT", (0.5, 40), 2), ("PHP", (10, 2000), 2), ("BTC", (0.0001, 0.002), 6), ("ETH", (0.001, 0.05), 5)]
CONVERTS = [
    ("USDT", "PHP", (2, 60), 2),
    ("PHP", "USDT", (100, 3000), 2),
    ("ETH", "USDT", (0.002, 0.05), 4),
    ("USDT", "ETH", (5, 80), 2),
    ("BTC", "USDT", (0.0002, 0.003), 5),
    ("USDT", "BTC", (5, 150), 2),
]
SUB_MOVES = [("USDT", (1, 50), 2), ("PHP", (10, 1500), 2), ("BTC", (0.0001, 0.002), 6)]
WHITELIST = {"ETH": "0x00000000000000000000000000000000000d3e40", "TRX": "TDemoMasterWhitezistAddress1111111"}
PATHS = {
    "transfer": ("POST", "/openapi/transfer/v4/transfers"),
    "transfer_query": ("GET", "/openapi/transfer/v3/transfers"),
    "deposit_address": ("GET", "/openapi/wallet/v1/deposit/address"),
    "sub_deposit_address": ("GET", "/openapi/v1/sub-account/wallet/deposit/address"),
    "deposit_history": ("GET", "/openapi/wallet/v1/deposit/history"),
    "sub_deposit_history": ("GET", "/openapi/v1/sub-account/wallet/deposit/history"),
    "withdrawal": ("POST", "/openapi/wallet/v1/withdraw/apply"),
    "withdraw_history": ("GET", "/openapi/wallet/v1/withdraw/history"),
    "quote": ("POST", "/openapi/convert/v1/get-quote"),
    "accept": ("POST", "/openapi/convert/v1/accept-quote"),
    "orders": ("POST", "/openapi/convert/v1/query-order-history"),
    "universal": ("POST", "/openapi/v1/sub-account/transfer/universal-transfer"),
    "universal_history": ("GET", "/openapi/v1/sub-account/transfer/universal-transfer-history"),
    "sub_to_master": ("POST", "/openapi/v1/sub-account/transfer/sub-to-master"),
    "sub_history": ("GET", "/openapi/v1/sub-account/transfer/sub-history"),
    "collect": ("POST", "/openapi/v1/fund-collect/collect-from-sub-account"),
    "fund_record": ("GET", "/openapi/v1/fund-collect/get-fund-record"),
    "restrict": ("POST", "/openapi/v1/sub-account/apikey/add-ip-restriction"),
    "unrestrict": ("POST", "/openapi/v1/sub-account/apikey/delete-ip-restriction"),
    "account": ("GET", "/openapi/v1/account"),
    "listen_key": ("POST", "/openapi/v1/userDataStream"),
    "pairs": ("POST", "/openapi/convert/v1/get-supported-trading-pairs"),
}


# --- the schedule: a function of the seed alone ----------------------------------------------------------


@dataclass
class Op:
    n: int
    at: float  # seconds after the load starts
    kind: str
    customer: int  # 1..K
    params: dict = field(default_factory=dict)


def schedule(seed: int, minutes: float, customers: int) -> tuple[list[Op], list[tuple[float, str]]]:
    """Every operation and fault of a run, from the seed alone."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    duration = minutes * 60.0
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    ops: list[Op] = []
    t = 1.0
    while True:
        t += rng.expovariate(OPS_PER_SECOND)
        if t >= duration:
            break
        kind = rng.choices(kinds, weights)[0]
        customer = rng.randint(1, customers)
        op = Op(len(ops), round(t, 3), kind, customer)
        p = op.params
        if kind == "transfer":
            asset, bounds, places = rng.choice(TRANSFERS)
            p.update(
                asset=asset,
                amount=_amount(rng, bounds, places),
                to=rng.choice([c for c in range(1, customers + 1) if c != customer] or [customer]),
            )
        elif kind == "deposit":
            coin, network, bounds, places = rng.choice(DEPOSITS)
            p.update(coin=coin, network=network, amount=_amount(rng, bounds, places), sub=rng.random() < 0.3)
        elif kind == "withdrawal":
            coin, network, bounds, places = rng.choice(WITHDRAWALS)
            p.update(coin=coin, network=network, amount=_amount(rng, bounds, places))
        elif kind in ("convert", "quote_expiry"):
            source, target, bounds, places = rng.choice(CONVERTS)
            p.update(source=source, target=target, amount=_amount(rng, bounds, places))
        elif kind in ("universal", "sub_to_master"):
            asset, bounds, places = rng.choice(SUB_MOVES)
            p.update(
                asset=asset, amount=_amount(rng, bounds, places), to_sub=kind == "universal" and rng.random() < 0.6
            )
        elif kind == "key_change":
            p.update(hold=round(rng.uniform(3.0, 8.0), 2))
        elif kind in ("duplicate", "replay"):
            # an earlier client-id operation, 3-40 s before (a replay within the 60 s recvWindow)
            earlier = [o for o in ops if o.kind in REPEATABLE and 3.0 <= t - o.at <= 40.0]
            if not earlier:
                continue
            p.update(of=rng.choice(earlier).n)
        ops.append(op)
    faults: list[tuple[float, str]] = []
    order = list(INFRA_FAULTS)
    rng.shuffle(order)
    # Short runs still meet every kind of fault once: the gaps shrink to fit them (not under 8 s).
    per = (duration - FIRST_FAULT_SECONDS - QUIET_END_SECONDS) / len(INFRA_FAULTS)
    gaps = FAULT_GAP_SECONDS if per >= FAULT_GAP_SECONDS[1] else (max(8.0, 0.8 * per), max(8.0, per))
    t = FIRST_FAULT_SECONDS
    while t < duration - QUIET_END_SECONDS:
        name = order[len(faults)] if len(faults) < len(order) else rng.choice(INFRA_FAULTS)
        faults.append((round(t, 3), name))
        t += rng.uniform(*gaps)
    return ops, faults


def digest(ops: list[Op], faults: list[tuple[float, str]]) -> str:
    text = json.dumps([[o.n, o.at, o.kind, o.customer, o.params] for o in ops] + [faults], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- what happened to each client id ------------------------------------------------------------------------


@dataclass
class Window:
    """A sub-account key restricted to a foreign IP: its own requests must be refused between
    `start` (the restriction's answer + 1 s) and `end` (when lifting it was sent)."""

    account: str
    start: float
    end: float = float("inf")
