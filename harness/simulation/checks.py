"""The simulation's end checks: balances as the clients were told, the streams, the answers."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from harness.chaos.checks import judge_segment
from harness.chaos.records import Check, tally
from harness.simulation.world import Customers, SimRecord


class EndChecks:
    """The end checks of a simulation on its `record`, for the `accounts` (their balances at the start
    and the end as the service reported them)."""

    def __init__(self, accounts: Customers, record: SimRecord) -> None:
        self.accounts, self.record = accounts, record

    # --- the end checks ---------------------------------------------------------------------------------

    def expected_balances(self) -> tuple[dict, Counter]:
        expected = {
            who: {a: total for a, (total, _) in self.record.start_balances[who].items()}
            for who in self.accounts.signers
        }
        counted: Counter = Counter()
        for move in self.record.moves.values():
            if move.state in ("acked", "resolved done"):
                counted[move.kind] += 1
                for who, asset, delta in move.legs:
                    expected[who][asset] = expected[who].get(asset, Decimal(0)) + delta
        for deposit in self.record.deposits:
            seen = self.record.credited.get(deposit["tx"], [])
            credited = [r for w, r in seen if w == deposit["who"] and r["status"] == 1]
            if len(seen) != 1 or len(credited) != 1:
                self.record.violations.append(
                    f"deposit {deposit['tx']} to {deposit['who']}: records {[(w, r['status']) for w, r in seen]}"
                )
            if credited:
                counted["deposit"] += 1
                if Decimal(credited[0]["amount"]) != deposit["amount"]:
                    self.record.violations.append(
                        f"deposit {deposit['tx']} credited {credited[0]['amount']}, sent {deposit['amount']}"
                    )
                expected[deposit["who"]][deposit["coin"]] = expected[deposit["who"]].get(
                    deposit["coin"], Decimal(0)
                ) + Decimal(credited[0]["amount"])
        return expected, counted

    def check_balances(self):
        expected, counted = self.expected_balances()
        wrong = []
        for who in self.accounts.signers:
            end = self.record.end_balances[who]
            for asset in sorted({*expected[who], *end}):
                want = expected[who].get(asset, Decimal(0))
                got, locked = end.get(asset, (Decimal(0), Decimal(0)))
                if want != got:
                    wrong.append(f"{who} {asset}: expected {want}, the service says {got} (difference {got - want})")
                if locked:
                    wrong.append(f"{who} {asset}: {locked} still locked after everything settled")
        accounts = len(self.accounts.signers)
        detail = (
            f"{accounts} accounts x assets: every balance = start + acknowledged operations {dict(counted)}"
            if not wrong
            else f"{len(wrong)} balances differ:\n      " + "\n      ".join(wrong[:20])
        )
        return Check("balances", not wrong, detail)

    def check_streams(self):
        lines, ok = [], True
        for segment in self.record.segments:
            judge_segment(self.record.positions[segment.account], segment)
            ok = ok and segment.ok
            end = f"closed by the server ({segment.closed_with})" if segment.closed else "to the end"
            if not segment.ok or segment.closed:
                lines.append(f"{segment.account} {end}: {'ok' if segment.ok else 'BROKEN'}: {segment.verdict}")
        segments = self.record.segments
        stayed = [s for s in segments if s.closed is None]
        frames = sum(len(s.feed.received) for s in self.record.segments)
        detail = (
            f"{len(segments)} connections on {self.record.customers} listenKeys ({len(stayed)} to the end, "
            f"{len(segments) - len(stayed)} closed by the server and replaced), {frames} positions received: "
            + ("every change exactly once and in order" if ok else "BROKEN")
            + ("\n      " + "\n      ".join(lines) if lines else "")
        )
        return Check("streams", ok and len(stayed) == self.record.customers, detail)

    def check_answers(self):
        breaking = [a for a in self.record.answers if a.breaks_a_rule]
        detail = f"{len(self.record.answers)} requests {tally(self.record.answers)}"
        if breaking:
            detail += f"; BREAKING THE RULES {tally(breaking)}: " + ", ".join(
                f"{a.kind} {a.ident}" for a in breaking[:10]
            )
        return Check("answers", not breaking, detail)
