"""Turn change-feed rows into the spec's events.

For each posting that changed an account: a `balanceUpdate` per asset whose total (free + locked)
changed, for every business type but TRADE (non-trading fund activity), then one
`outboundAccountPosition` with free and locked after the change of every asset the posting touched.
A master whose operators whitelisted it also receives its sub-accounts' events, with `em` (the
sub-account's e-mail) and, on balanceUpdate, `BI` (the business serial number: the posting id).
"""

from __future__ import annotations

import time
from decimal import Decimal

from exchange.api import formatting as fmt

NON_FUND_ACTIVITY = {"TRADE"}


def row_payload(
    *,
    seq: int,
    asset: str,
    precision: int,
    delta_free,
    delta_locked,
    free,
    locked,
    kind: str,
    posting_id: int,
    created_ms: int,
) -> dict:
    """A change-feed row as it travels over the channel layer (JSON: decimals as text)."""
    return {
        "seq": seq,
        "asset": asset,
        "precision": precision,
        "delta_free": str(delta_free),
        "delta_locked": str(delta_locked),
        "free": str(free),
        "locked": str(locked),
        "kind": kind,
        "posting": posting_id,
        "time": created_ms,
    }


def build_events(rows: list[dict], *, email: str | None = None, now_ms: int | None = None) -> list[dict]:
    """Events for consecutive rows of one account (sorted by seq). `email` set: the master's view
    of a sub-account (adds em and BI)."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    events: list[dict] = []
    start = 0
    while start < len(rows):
        end = start
        while end < len(rows) and rows[end]["posting"] == rows[start]["posting"]:
            end += 1
        batch = rows[start:end]
        for row in batch:
            delta = Decimal(row["delta_free"]) + Decimal(row["delta_locked"])
            if row["kind"] in NON_FUND_ACTIVITY or delta == 0:
                continue
            event = {
                "e": "balanceUpdate",
                "E": now_ms,
                "a": row["asset"],
                "d": fmt.amount(delta, row["precision"]),
                "T": row["time"],
                "BS": row["kind"],
            }
            if email:
                event["em"] = email
                event["BI"] = str(row["posting"])
            events.append(event)
        position = {
            "e": "outboundAccountPosition",
            "E": now_ms,
            "u": batch[-1]["time"],
            "B": [
                {
                    "a": row["asset"],
                    "f": fmt.amount(Decimal(row["free"]), row["precision"]),
                    "l": fmt.amount(Decimal(row["locked"]), row["precision"]),
                }
                for row in batch
            ],
        }
        if email:
            position["em"] = email
        events.append(position)
        start = end
    return events
