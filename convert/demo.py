"""The convert part of the demo world (idempotent), loaded after wallet's (settings.DEMO_LOADERS):
markets BTC/PHP, USDT/PHP, ETH/USDT and BTC/USDT with believable prices, a pair each way for each,
and the house's convert liquidity funded from equity."""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import BusinessType, Posting
from accounts.models import Asset, SystemRole
from convert.models import Market, Pair

# base, quote, price (quote per base), spread bps
MARKETS = [
    ("BTC", "PHP", "5200000", 20),
    ("USDT", "PHP", "58.20", 15),
    ("ETH", "USDT", "3100", 20),
    ("BTC", "USDT", "89500", 20),
]
# source: min, max source amounts
BOUNDS = {
    "BTC": ("0.0001", "5"),
    "ETH": ("0.001", "100"),
    "USDT": ("1", "500000"),
    "PHP": ("50", "25000000"),
}
# target: decimal places of the target amount
PRECISION = {"BTC": 8, "ETH": 8, "USDT": 6, "PHP": 2}
LIQUIDITY = {"BTC": "50", "ETH": "800", "USDT": "5000000", "PHP": "250000000"}


def load(customers: int = 0) -> dict[str, dict]:  # customers: accounts.demo's
    assets = {asset.code: asset for asset in Asset.objects.filter(code__in=PRECISION)}
    now = timezone.now()
    for base, quote, price, spread in MARKETS:
        market, _ = Market.objects.get_or_create(
            base=assets[base],
            quote=assets[quote],
            defaults={
                "anchor_price": Decimal(price),
                "price": Decimal(price),
                "price_updated_at": now,
                "spread_bps": spread,
            },
        )
        for source, target in ((base, quote), (quote, base)):
            minimum, maximum = BOUNDS[source]
            Pair.objects.get_or_create(
                source=assets[source],
                target=assets[target],
                defaults={
                    "market": market,
                    "min_source_amount": Decimal(minimum),
                    "max_source_amount": Decimal(maximum),
                    "precision": PRECISION[target],
                },
            )
    shards = ledger.role_account_ids(SystemRole.CONVERT_LIQUIDITY)
    equity = ledger.system_account_id(SystemRole.EQUITY)
    for code, amount in LIQUIDITY.items():
        reference = f"demo-convert-liquidity:{code}"
        if Posting.objects.filter(reference=reference).exists():
            continue
        share = Decimal(amount) / len(shards)
        legs = []
        for shard in shards:
            legs += ledger.move(equity, shard, code, share.quantize(Decimal("1e-8")))
        ledger.post(legs=legs, kind=BusinessType.OTHERS, reference=reference, memo="demo convert liquidity")
    return {}
