"""The convert part of the demo world (idempotent), loaded after wallet's (settings.DEMO_LOADERS):
one believable price per asset (in PHP, the default numeraire), markets BTC/PHP, USDT/PHP, ETH/USDT
and BTC/USDT priced from them, a pair each way for each, and the house's convert liquidity funded
from equity."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import BusinessType, Posting
from accounts.models import Asset, SystemRole
from convert.models import AssetPrice, Market, Pair

# one price per asset, in PHP (ETH: 3,100 USDT); every market's price is derived from these
PRICES_IN_PHP = {"PHP": "1", "BTC": "5200000", "USDT": "58.20", "ETH": "180420"}
# base, quote, spread bps
MARKETS = [
    ("BTC", "PHP", 20),
    ("USDT", "PHP", 15),
    ("ETH", "USDT", 20),
    ("BTC", "USDT", 20),
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
    numeraire = Decimal(PRICES_IN_PHP.get(settings.CONVERT_NUMERAIRE, "0"))
    for code, price in PRICES_IN_PHP.items():
        if code == settings.CONVERT_NUMERAIRE or not numeraire:
            continue
        in_numeraire = (Decimal(price) / numeraire).quantize(Decimal("1e-18"))
        AssetPrice.objects.get_or_create(
            asset=assets[code], defaults={"anchor_price": in_numeraire, "price": in_numeraire, "price_updated_at": now}
        )
    for base, quote, spread in MARKETS:
        market, _ = Market.objects.get_or_create(
            base=assets[base], quote=assets[quote], defaults={"spread_bps": spread}
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
