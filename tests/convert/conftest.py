"""Fixtures of the convert tests: the demo's markets, pairs and liquidity on factory-made assets."""

import pytest

from convert import demo as convert_demo
from tests.support.factories import AssetFactory


@pytest.fixture
def convert_world(db, settings):
    settings.CONVERT_QUOTE_INTERVAL_MS = 0  # most tests quote repeatedly; the throttle has its own test
    for code in ("BTC", "ETH", "USDT", "PHP"):
        AssetFactory(code=code)
    convert_demo.load()
