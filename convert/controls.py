"""How staff change convert's settings that matter to money (exchange/backoffice/changes.py; the directions
are explained in accounts/controls.py). Every change needs a reason and is audited; these wait for a
second Administrator:

- AssetPrice: an anchor moved further than staff may move it alone - a price too low lets customers
  buy the asset cheap, too high lets them sell it dear. The bound is on the value, not on the person
  (issue 34, finding 3: five nudges of 0.99% moved BTC 5.05%): within CONVERT_ANCHOR_WINDOW (24 h),
  the moves applied without a second Administrator, by anyone, add up, and a change that takes their
  sum beyond CONVERT_ANCHOR_NUDGE_BPS (100, 1%) of the reference waits. The reference is the last
  anchor a second Administrator approved within the window, else the anchor in force when the window
  began (the audit trail is the history: exchange.StaffAction, written in the change's transaction).
  Moves back count too, so a nudge cannot be repeated up and down either. Saving an anchor moves the
  price there at once (convert.services.asset_price_apply). The simulated market's step and band
  raised.
- Market: the spread lowered (the spread is what makes every cycle of conversions lose).
- Pair: the minimum lowered, the maximum raised, the fee lowered, the precision raised, a pair
  switched on (off applies at once: a stop is never delayed); its assets or market changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.utils import timezone

from convert import services
from convert.models import AssetPrice, Market, Pair
from exchange.backoffice.changes import ANY, HIGHER, LOWER, ON, OfRow, guard
from exchange.backoffice.models import StaffAction

CONVERT_ANCHOR_NUDGE_BPS = 100
CONVERT_ANCHOR_WINDOW = timedelta(hours=24)

_ALONE, _APPROVED, _CREATED = "asset_price.change", "asset_price.approve", "asset_price.create"


@dataclass(frozen=True)
class AnchorBudget:
    """What staff may still move an asset's anchor without a second Administrator."""

    reference: Decimal  # the last approved anchor within the window, else the one in force when it began
    moved_alone: Decimal  # the sum of the moves applied alone since (both ways)
    readable: bool = True  # False: the history could not be read (every move then waits)

    @property
    def limit(self) -> Decimal:
        return self.reference * CONVERT_ANCHOR_NUDGE_BPS / 10000

    def allows(self, old: Decimal, new: Decimal) -> bool:
        """Whether moving the anchor from `old` to `new` stays within what may be done alone."""
        if not self.readable or self.reference <= 0:
            return False
        bound = self.reference * CONVERT_ANCHOR_NUDGE_BPS
        return (self.moved_alone + abs(new - old)) * 10000 <= bound and abs(new - self.reference) * 10000 <= bound


def _decimal(value) -> Decimal | None:
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def anchor_budget(row: AssetPrice, *, now: datetime | None = None) -> AnchorBudget:
    """The anchor's reference and the moves made alone since, from the audit trail of the last
    CONVERT_ANCHOR_WINDOW (every staff change of an anchor is recorded there, in its own transaction)."""
    start = (now or timezone.now()) - CONVERT_ANCHOR_WINDOW
    records = StaffAction.objects.filter(
        object_type=AssetPrice._meta.label_lower,
        object_id=str(row.pk),
        created_at__gt=start,
        action__in=(_ALONE, _APPROVED, _CREATED),
    ).order_by("id")
    reference: Decimal | None = None
    moved = Decimal(0)
    for record in records:
        if "anchor_price" not in (record.after or {}):
            continue  # another field of the row changed
        after = _decimal(record.after["anchor_price"])
        before = _decimal((record.before or {}).get("anchor_price"))
        if after is None or (record.action == _ALONE and before is None):
            return AnchorBudget(reference=Decimal(row.anchor_price), moved_alone=moved, readable=False)
        if record.action != _ALONE:  # a value a second Administrator approved, or a new row's first
            reference, moved = after, Decimal(0)
            continue
        if reference is None:  # the first move in the window: what it moved from was in force then
            reference = before
        moved += abs(after - before)
    if reference is None:  # nothing moved it for a whole window
        reference = Decimal(row.anchor_price)
    return AnchorBudget(reference=reference, moved_alone=moved)


def anchor_move_loosens(row: AssetPrice, old, new) -> bool:
    """The rule of `anchor_price` (exchange.backoffice.changes.OfRow, called with the row locked): a
    move beyond what may be done alone (AnchorBudget.allows), from or to a value that is not a
    positive number, waits for a second Administrator."""
    before, after = _decimal(old), _decimal(new)
    if before is None or after is None or before <= 0 or after <= 0:
        return old != new
    return not anchor_budget(row).allows(before, after)


def register() -> None:
    guard(
        AssetPrice,
        action="asset_price",
        fields={
            "asset": ANY,
            "anchor_price": OfRow(anchor_move_loosens),
            "walk_step_bps": HIGHER,
            "walk_band_bps": HIGHER,
        },
        apply=services.asset_price_apply,
    )
    guard(Market, action="market", fields={"base": ANY, "quote": ANY, "spread_bps": LOWER})
    guard(
        Pair,
        action="pair",
        fields={
            "source": ANY,
            "target": ANY,
            "market": ANY,
            "min_source_amount": LOWER,
            "max_source_amount": HIGHER,
            "precision": HIGHER,
            "fee_bps": LOWER,
            "enabled": ON,
        },
    )
