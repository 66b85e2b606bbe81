"""The simulation's end checks: balances as the clients were told, the streams, the answers."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from harness.chaos.checks import judge_segment
from harness.chaos.records import Check, tally


class EndChecks:
    """The end checks of a simulation (a part of driver.Simulation)."""

    # --- the end checks ---------------------------------------------------------------------------------

    def expected_balances(self) -> tuple[dict, Counter]:
        expected = {who: {a: total for a, (total, _) in self.start_balances[who].items()} for who in self.signers}
        counted: Counter = Counter()
        for move in self.moves.values():
            if move.state in ("acked", "resolved done"):
                counted[move.kind] += 1
                for who, asset, delta in move.legs:
                    expected[who][asset] = expected[who].get(asset, Decimal(0)) + delta
        for deposit in self.deposits:
            seen = self.credited.get(deposit["tx"], [])
            credited = [r for w, r in seen if w == deposit["who"] and r["status"] == 1]
            if len(seen) != 1 or len(credited) != 1:
                self.violations.append(
                    f"deposit {deposit['tx']} to {deposit['who']}: records {[(w, r['status']) for w, r in seen]}"
                )
            if credited:
                counted["deposit"] += 1
                if Decimal(credited[0]["amount"]) != deposit["amount"]:
                    self.violations.append(
                        f"deposit {deposit['tx']} credited {credited[0]['amount']}, sent {deposit['amount']}"
                    )
                expected[deposit["who"]][deposit["coin"]] = expected[deposit["who"]].get(
                    deposit["coin"], Decimal(0)
                ) + Decimal(credited[0]["amount"])
        return expected, counted

    def check_balances(self):
        expected, counted = self.expected_balances()
        wrong = []
        for who in self.signers:
            end = self.end_balances[who]
            for asset in sorted({*expected[who], *end}):
                want = expected[who].get(asset, Decimal(0))
                got, locked = end.get(asset, (Decimal(0), Decimal(0)))
                if want != got:
                    wrong.append(f"{who} {asset}: expected {want}, the service says {got} (difference {got - want})")
                if locked:
                    wrong.append(f"{who} {asset}: {locked} still locked after everything settled")
        accounts = len(self.signers)
        detail = (
            f"{accounts} accounts x assets: every balance = start + acknowledged operations {dict(counted)}"
            if not wrong
            else f"{len(wrong)} balances differ:\n      " + "\n      ".join(wrong[:20])
        )
        return Check("balances", not wrong, detail)

    def check_streams(self):
        lines, ok = [], True
        for segment in self.segments:
            judge_segment(self.positions[segment.account], segment)
            ok = ok and segment.ok
            end = f"closed by the server ({segment.closed_with})" if segment.closed else "to the end"
            if not segment.ok or segment.closed:
                lines.append(f"{segment.account} {end}: {'ok' if segment.ok else 'BROKEN'}: {segment.verdict}")
        stayed = [s for s in self.segments if s.closed is None]
        frames = sum(len(s.feed.received) for s in self.segments)
        detail = (
            f"{len(self.segments)} connections on {self.customers} listenKeys ({len(stayed)} to the end, "
            f"{len(self.segments) - len(stayed)} closed by the server and replaced), {frames} positions received: "
            + ("every change exactly once and in order" if ok else "BROKEN")
            + ("\n      " + "\n      ".join(lines) if lines else "")
        )
        return Check("streams", ok and len(stayed) == self.customers, detail)

    def check_answers(self):
        breaking = [a for a in self.answers if a.breaks_a_rule]
        detail = f"{len(self.answers)} requests {tally(self.answers)}"
        if breaking:
            detail += f"; BREAKING THE RULES {tally(breaking)}: " + ", ".join(
                f"{a.kind} {a.ident}" for a in breaking[:10]
            )
        return Check("answers", not breaking, detail)
