"""Fixtures of the streams tests; the helpers are in tests/support (streams.py, factories.py)."""

import pytest

from tests.support.factories import AssetFactory


@pytest.fixture
def assets(db):
    AssetFactory(code="BTC")
    AssetFactory(code="PHP")
