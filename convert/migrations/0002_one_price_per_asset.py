"""One price per asset in the numeraire (issue 25): markets no longer hold prices of their own.

Each asset's price is found from the markets as they were, walking out from the numeraire
(CONVERT_NUMERAIRE) in market order: an asset quoted against the numeraire takes that market's
price; an asset reached only through another market (ETH via ETH/USDT) takes that market's price
times the other asset's. Markets not used on the way (BTC/USDT when BTC/PHP and USDT/PHP exist) are
from now on priced by their two assets' prices."""

from decimal import Decimal, localcontext

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def prices_per_asset(apps, schema_editor):
    Market = apps.get_model("convert", "Market")
    Asset = apps.get_model("accounts", "Asset")
    AssetPrice = apps.get_model("convert", "AssetPrice")
    numeraire = Asset.objects.filter(code=settings.CONVERT_NUMERAIRE).values_list("pk", flat=True).first()
    if numeraire is None:
        return
    markets = list(Market.objects.order_by("pk"))
    known = {numeraire: (Decimal(1), Decimal(1), None, 5, 300)}  # asset: price, anchor, time, step, band
    grew = True
    with localcontext(prec=60):
        while grew:
            grew = False
            for m in markets:
                if m.quote_id in known and m.base_id not in known:
                    price, anchor, _, _, _ = known[m.quote_id]
                    known[m.base_id] = (m.price * price, m.anchor_price * anchor, m.price_updated_at,
                                        m.walk_step_bps, m.walk_band_bps)
                    grew = True
                elif m.base_id in known and m.quote_id not in known:
                    price, anchor, _, _, _ = known[m.base_id]
                    known[m.quote_id] = (price / m.price, anchor / m.anchor_price, m.price_updated_at,
                                         m.walk_step_bps, m.walk_band_bps)
                    grew = True
    places = Decimal("1e-18")
    for asset_id, (price, anchor, at, step, band) in known.items():
        if asset_id == numeraire:
            continue
        AssetPrice.objects.create(
            asset_id=asset_id, price=price.quantize(places), anchor_price=anchor.quantize(places),
            price_updated_at=at, walk_step_bps=step, walk_band_bps=band,
        )


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0013_system_role_shards'),
        ('convert', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='AssetPrice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('anchor_price', models.DecimalField(decimal_places=18, help_text="Operators' price: numeraire units per one unit of the asset.", max_digits=36)),
                ('price', models.DecimalField(decimal_places=18, help_text='The current price in the numeraire (moves around the anchor).', max_digits=36)),
                ('price_updated_at', models.DateTimeField(help_text='When the price source last confirmed the price.')),
                ('walk_step_bps', models.PositiveIntegerField(default=5, help_text='Simulated market: the largest move per tick (0: the price stays at the anchor).')),
                ('walk_band_bps', models.PositiveIntegerField(default=300, help_text='Simulated market: the price stays within this distance of the anchor.')),
                ('asset', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='accounts.asset')),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('anchor_price__gt', 0), ('price__gt', 0)), name='asset_price_positive')],
            },
        ),
        migrations.RunPython(prices_per_asset, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name='market', name='market_price_positive'),
        migrations.RemoveField(model_name='market', name='anchor_price'),
        migrations.RemoveField(model_name='market', name='price'),
        migrations.RemoveField(model_name='market', name='price_updated_at'),
        migrations.RemoveField(model_name='market', name='walk_step_bps'),
        migrations.RemoveField(model_name='market', name='walk_band_bps'),
    ]
