"""How staff change convert's settings that matter to money (exchange/backoffice/changes.py; the directions
are explained in accounts/controls.py). Every change needs a reason and is audited; these wait for a
second Administrator:

- AssetPrice: an anchor moved by more than CONVERT_ANCHOR_NUDGE_BPS (100) either way - a price too
  low lets customers buy the asset cheap, too high lets them sell it dear; a smaller nudge applies
  at once. Saving an anchor moves the price there at once (convert.services.asset_price_apply). The
  simulated market's step and band raised.
- Market: the spread lowered (the spread is what makes every cycle of conversions lose).
- Pair: the minimum lowered, the maximum raised, the fee lowered, the precision raised, a pair
  switched on (off applies at once: a stop is never delayed); its assets or market changed.
"""

from __future__ import annotations

from convert import services
from convert.models import AssetPrice, Market, Pair
from exchange.backoffice.changes import ANY, HIGHER, LOWER, ON, guard, moved_more_than_bps

CONVERT_ANCHOR_NUDGE_BPS = 100


def register() -> None:
    guard(
        AssetPrice,
        action="asset_price",
        fields={
            "asset": ANY,
            "anchor_price": moved_more_than_bps(CONVERT_ANCHOR_NUDGE_BPS),
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
