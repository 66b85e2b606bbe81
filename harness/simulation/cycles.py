"""The simulation's cycle customer (issue 25, finding 1; docs/operations.md, "The seeded simulation"):
a customer who converts round every cycle of the supported pairs, and the two end checks that the
house never loses on a conversion at its own market price (`convert_pnl`) and that no cycle returned
more than the market moved (`cycles`, judged against a witness's quotes of the same directions).

The pure parts (the cycles of a set of pairs, the plan from the seed, an order's P&L, a cycle's
verdict) are functions; `CycleCustomer` runs the customer and checks."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Decimal, localcontext

from harness.chaos.records import Check, now
from harness.private import Stack
from harness.simulation.moves import Move, _amount
from harness.simulation.world import Customers, SimRecord

# The cycle customer (issue 25, finding 1): closed trails of up to this many conversions, each
# directed pair at most once; a cycle starts with this many times its first pair's minimum.
CYCLE_MAX_LEGS = 5
CYCLE_START_MULTIPLE = (20.0, 200.0)
CYCLE_QUOTE_TRIES = 5  # a leg's quote refused as too soon (the per-pair interval) is asked again
# Market prices are stored to 18 places (a price of 1.7e-7 keeps 11 digits): a product of a few of
# them is exact to about 1e-10; the cycle rule allows this much relative slack for it.
PRICE_ROUNDING = Decimal("1e-9")


def closed_trails(pairs, max_legs: int = CYCLE_MAX_LEGS) -> list[tuple[str, ...]]:
    """Every cycle of conversions over `pairs` ((source, target) directions) that starts and ends in
    the same asset, has 2..max_legs legs and uses each direction at most once: the 2-cycles
    (PHP -> USDT -> PHP), the triangles and the longer trails through a currency twice
    (PHP -> USDT -> ETH -> USDT -> PHP). As asset paths, in a fixed order."""
    onward: dict[str, list[str]] = defaultdict(list)
    for source, target in sorted(set(pairs)):
        onward[source].append(target)
    found: list[tuple[str, ...]] = []

    def extend(path: list[str], used: frozenset) -> None:
        for nxt in onward[path[-1]]:
            leg = (path[-1], nxt)
            if leg in used:
                continue
            if nxt == path[0]:
                found.append((*path, nxt))
            elif len(path) < max_legs:  # room for this leg and one more to come back
                extend([*path, nxt], used | {leg})

    for start in sorted(onward):
        extend([start], frozenset())
    return sorted(found, key=lambda path: (len(path), path))


def cycle_plan(seed: int, pairs: dict, places: dict, count: int) -> list[tuple[tuple[str, ...], str]]:
    """The cycle customer's cycles, from the seed and the supported pairs alone: (asset path, start
    amount) each. `pairs`: {(source, target): (minimum, maximum)}; `places`: an asset's decimals."""
    rng = random.Random(f"cycles/{seed}")  # noqa: S311 - a reproducible plan, not a secret
    trails = closed_trails(pairs)
    plan = []
    for _ in range(count if trails else 0):
        path = rng.choice(trails)
        low, high = pairs[path[0], path[1]]
        bounds = (float(low) * CYCLE_START_MULTIPLE[0], min(float(high), float(low) * CYCLE_START_MULTIPLE[1]))
        plan.append((path, _amount(rng, bounds, places.get(path[0], 2))))
    return plan


def order_pnl(source_amount: Decimal, target_amount: Decimal, fee: Decimal, market_price: Decimal) -> Decimal:
    """The house's gain on one conversion in target units, at the order's own quote's market price
    (target per source before the spread): what it received, less what its liquidity paid out."""
    with localcontext(prec=60):
        return source_amount * market_price - (target_amount + fee)


def order_loses(pnl: Decimal, places: int | None) -> bool:
    """More than one unit of the target's decimals (the rounding of one amount) lost; an order
    whose target's decimals are unknown is judged exactly."""
    return pnl < -(Decimal(1).scaleb(-places) if places is not None else Decimal(0))


@dataclass(frozen=True)
class CycleVerdict:
    ratio: Decimal  # end / start
    movement: Decimal  # product(leg's market price / witness's): the market's move while it went round
    gap: Decimal  # product(witness's market price): the price source's own cycle at one instant

    @property
    def one_snapshot(self) -> bool:
        return self.movement == 1

    @property
    def ok(self) -> bool:
        return self.ratio <= self.movement * (1 + PRICE_ROUNDING)

    @property
    def bps(self) -> Decimal:
        return (self.ratio - 1) * 10000


def judge_cycle(start: Decimal, end: Decimal, leg_prices: list[Decimal], witness_prices: list[Decimal]) -> CycleVerdict:
    """A completed cycle against the market's movement (Simulation.check_cycles says why)."""
    with localcontext(prec=60):
        movement, gap = Decimal(1), Decimal(1)
        for price, seen in zip(leg_prices, witness_prices, strict=True):
            movement, gap = movement * price / seen, gap * seen
        return CycleVerdict(end / start, movement, gap)


def cycle_digest(plan) -> str:
    return hashlib.sha256(json.dumps(plan).encode()).hexdigest()[:16]


@dataclass
class Cycle:
    """One cycle the cycle customer tried: its legs as quoted (and accepted), and the witness's
    quotes of the same directions taken right after the last leg (`witnesses`: direction -> quote id)."""

    n: int
    path: tuple[str, ...]
    start: Decimal
    legs: list[dict] = field(default_factory=list)  # the accepted quotes, in order
    witnesses: dict = field(default_factory=dict)
    broken: str = ""  # why it did not complete

    @property
    def directions(self) -> list[tuple[str, str]]:
        return list(itertools.pairwise(self.path))

    @property
    def completed(self) -> bool:
        return not self.broken and len(self.legs) == len(self.path) - 1

    @property
    def end(self) -> Decimal:
        return Decimal(self.legs[-1]["targetAmount"])


class CycleCustomer:
    """The cycle customer ("cycler", with its "witness", of `accounts`) and its two end checks (on the
    orders in the `stack`'s database and the ones the customers' histories showed, in the `record`)."""

    def __init__(self, stack: Stack, accounts: Customers, record: SimRecord) -> None:
        self.stack, self.accounts, self.record = stack, accounts, record
        self.cycles: list[Cycle] = []
        self.quoted: dict[tuple, float] = {}  # (account, direction) -> when its last quote was answered
        self.pair_places: dict[tuple, int] = {}  # (source, target) -> the target amount's decimals

    # --- the cycle customer (issue 25, finding 1) -------------------------------------------------------------

    async def cycle_customer(self, stopping: asyncio.Event) -> None:
        """Converts round cycles of currencies (the seed's plan over the supported pairs), each leg's
        source amount what the previous leg delivered, as fast as the per-pair quote interval
        allows, until the load ends. A leg refused or unanswered breaks its cycle; the next starts
        from the plan again (the account's balances carry every asset)."""
        envelope = await self.accounts.settled_call("cycler", "pairs", {})
        listed = envelope.get("data") or []
        self.pair_places = {(p["sourceCurrency"], p["targetCurrency"]): int(p["precision"]) for p in listed}
        bounds = {
            (p["sourceCurrency"], p["targetCurrency"]): (Decimal(p["minSourceAmount"]), Decimal(p["maxSourceAmount"]))
            for p in listed
        }
        places: dict[str, int] = {}  # an asset's decimals: the precision of the pairs paying it out
        for (_, target), n in self.pair_places.items():
            places[target] = min(n, places.get(target, n))
        plan = cycle_plan(self.record.seed, bounds, places, int(self.record.minutes * 60 * 4) + 10)
        self.record.say(
            f"cycle customer: {len(closed_trails(bounds))} cycles over {len(bounds)} pairs, plan {cycle_digest(plan)}"
        )
        for n, (path, start) in enumerate(plan):
            cycle = Cycle(n, path, Decimal(start))
            # Its directions free again for both accounts (the witness then quotes without waiting).
            ready = max(
                (self.quoted.get((who, d), 0.0) for who in ("cycler", "witness") for d in cycle.directions), default=0.0
            )
            await asyncio.sleep(max(0.0, ready + self.accounts.quote_interval + 0.05 - now()))
            if stopping.is_set():
                return
            self.cycles.append(cycle)
            await self.run_cycle(cycle, bounds, places)
            self.record.outcomes["cycle"]["completed" if cycle.completed else f"broken: {cycle.broken}"] += 1
            if not cycle.completed:
                await asyncio.sleep(0.5)  # an outage: not a busy loop

    async def run_cycle(self, cycle: Cycle, bounds: dict, places: dict) -> None:
        amount = cycle.start
        for source, target in cycle.directions:
            low, high = bounds[source, target]
            if not low <= amount <= high:
                cycle.broken = f"{amount} {source} outside {source}->{target}'s bounds"
                return
            quote, why = await self._cycle_quote("cycler", source, target, amount)
            if quote is None:
                cycle.broken = f"leg {len(cycle.legs) + 1} {why}"
                return
            ident = quote["quoteId"]
            legs = [
                ("cycler", source, -Decimal(quote["sourceAmount"])),
                ("cycler", target, Decimal(quote["targetAmount"])),
            ]
            move = self.record.moves[ident] = Move("convert", ident, legs, signer="cycler")
            answer, data = await self.accounts.call("cycler", "accept", {"quoteId": ident}, kind="cycle", ident=ident)
            move.answered(answer)  # an unknown outcome is resolved with the order history at the end
            move.done.set()
            if answer.status != 200:
                cycle.broken = f"leg {len(cycle.legs) + 1} accept {answer.label}"
                return
            if data.get("status") != 0:
                move.state = "refused"
                cycle.broken = f"leg {len(cycle.legs) + 1} accept refused: {data.get('error')}"
                return
            order_status = (data.get("data") or {}).get("status")
            cycle.legs.append(quote)
            if order_status != "SUCCESS":
                cycle.broken = f"leg {len(cycle.legs)} order {order_status}"
                return
            # What it delivered, to the next leg's source decimals (dust stays in the account).
            amount = Decimal(quote["targetAmount"]).quantize(Decimal(1).scaleb(-places.get(target, 8)), ROUND_DOWN)
        # The witness: every direction of the cycle quoted again at once, right after the last leg.
        asked = await asyncio.gather(
            *(
                self._cycle_quote("witness", s, t, Decimal(leg["sourceAmount"]))
                for (s, t), leg in zip(cycle.directions, cycle.legs, strict=True)
            )
        )
        cycle.witnesses = {d: quote["quoteId"] for d, (quote, _) in zip(cycle.directions, asked, strict=True) if quote}

    async def _cycle_quote(self, who: str, source: str, target: str, amount: Decimal) -> tuple[dict | None, str]:
        """A quote for `amount` of `source`, waiting out (and asking again after) the per-pair interval."""
        params = {"sourceCurrency": source, "targetCurrency": target, "sourceAmount": f"{amount:f}"}
        why = ""
        for _ in range(CYCLE_QUOTE_TRIES):
            last = self.quoted.get((who, (source, target)), 0.0)
            await asyncio.sleep(max(0.0, last + self.accounts.quote_interval + 0.05 - now()))
            answer, data = await self.accounts.call(who, "quote", params, kind="cycle")
            self.quoted[who, (source, target)] = now()
            if answer.status == 200 and data.get("status") == 0:
                return data["data"], ""
            error = str(data.get("error") or "") if isinstance(data, dict) else ""
            why = f"quote {answer.label} {error}".strip()
            if "one per" not in error:  # not the interval: the leg is refused
                return None, why
        return None, why

    def check_convert_pnl(self):
        """Every successful conversion, valued at its own quote's market price (target units per
        source unit before the spread): what the house received is worth at least what it paid out
        (target amount and fee, both from its convert liquidity), less one unit of the target's
        decimals for rounding. The total per asset is the house's convert P&L (at those prices)."""
        rows = self.stack.book.rows(
            "SELECT q.quote_id, o.source_amount, o.target_amount, o.fee, q.market_price"
            " FROM convert_order o JOIN convert_quote q ON q.id = o.quote_id WHERE o.status = 'SUCCESS'"
        )
        totals: dict[str, Decimal] = defaultdict(Decimal)
        counts: Counter = Counter()
        losing = []
        for ident, source_amount, target_amount, fee, market_price in rows:
            seen = (self.record.api_orders.get(ident) or [{}])[0]
            asset = seen.get("targetCurrency", "?")  # an order no customer's history shows: judged exactly
            places = self.pair_places.get((seen.get("sourceCurrency"), asset))
            pnl = order_pnl(source_amount, target_amount, fee, market_price)
            totals[asset] += pnl
            counts[asset] += 1
            if order_loses(pnl, places):
                losing.append(
                    f"quote {ident}: {source_amount} x {market_price} < {target_amount} + fee {fee} {asset}"
                    f" (P&L {pnl:.{18 if places is None else places}f})"
                )
        figures = ", ".join(
            f"{asset} {totals[asset]:+.{self.pair_places_of(asset)}f} ({counts[asset]} orders)"
            for asset in sorted(totals)
        )
        detail = f"{len(rows)} successful orders at their quotes' market prices: house P&L {figures or 'none'}"
        if losing:
            detail += f"; {len(losing)} LOSING:\n      " + "\n      ".join(losing[:10])
        return Check("convert_pnl", not losing, detail)

    def pair_places_of(self, asset: str) -> int:
        return min((n for (_, target), n in self.pair_places.items() if target == asset), default=8)

    def check_cycles(self):
        """The cycle customer never ends a cycle richer than it started, beyond what the market moved
        while it went round. The legs are quoted one after another (each amount is what the last
        delivered), so a price tick may fall between them; right after the last leg, the witness
        quotes every direction of the cycle (at once: one instant of the market, a tick apart from
        it only by chance). Then the end amount over the start is at most
            product over the legs (customer price) <= product(leg's market price)
            = product(leg's market price / witness's market price) x product(witness's market price),
        the first factor the market's movement between the legs and the witness, the second the
        price source's own cycle at one instant: 1 when every pair's price derives from one price per
        asset, more than 1 an arbitrage. The rule: return <= that movement. When no price moved
        (every leg's market price equals the witness's: all legs quoted at one snapshot) it is the
        strict rule, end <= start. A cycle without its witness (refused in a fault) is reported, not
        judged; a broken cycle (a leg refused or unanswered) is neither."""
        completed = [c for c in self.cycles if c.completed]
        idents = [leg["quoteId"] for c in completed for leg in c.legs] + [
            q for c in completed for q in c.witnesses.values()
        ]
        market = dict(
            self.stack.book.rows("SELECT quote_id, market_price FROM convert_quote WHERE quote_id = ANY(%s)", [idents])
        )
        failures, returns, same, moved, unwitnessed, gaps = [], [], [], [], [], []
        for cycle in completed:
            legs = [market.get(leg["quoteId"]) for leg in cycle.legs]
            witnessed = [market.get(cycle.witnesses.get(d)) for d in cycle.directions]
            if None in legs or None in witnessed:
                returns.append((cycle.end / cycle.start - 1) * 10000)
                unwitnessed.append(returns[-1])
                continue
            verdict = judge_cycle(cycle.start, cycle.end, legs, witnessed)
            returns.append(verdict.bps)
            gaps.append((verdict.gap - 1) * 10000)
            (same if verdict.one_snapshot else moved).append(verdict.bps)
            if not verdict.ok:
                failures.append(
                    f"cycle {cycle.n} {'->'.join(cycle.path)}: {cycle.start} -> {cycle.end} ({verdict.bps:+.1f} bps),"
                    f" market movement {(verdict.movement - 1) * 10000:+.1f} bps"
                )
        broken = Counter(c.broken.split(":")[0] for c in self.cycles if not c.completed)

        def spread(values) -> str:
            if not values:
                return "none"
            ordered = sorted(values)
            return f"min {ordered[0]:+.1f}, median {ordered[len(ordered) // 2]:+.1f}, max {ordered[-1]:+.1f} bps"

        detail = (
            f"{len(completed)} completed of {len(self.cycles)} tried (lengths "
            f"{dict(sorted(Counter(len(c.path) - 1 for c in completed).items()))}); returns {spread(returns)}; "
            f"one snapshot {len(same)} ({spread(same)}), a tick between {len(moved)} ({spread(moved)}), "
            f"no witness {len(unwitnessed)}; the price source round the cycle at the witness (before spreads): "
            f"{spread(gaps)}; broken {dict(broken) or 'none'}"
        )
        if failures:
            detail += f"; {len(failures)} RICHER THAN THE MARKET MOVED:\n      " + "\n      ".join(failures[:10])
        return Check("cycles", not failures, detail)
