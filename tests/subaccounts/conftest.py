"""Fixtures of the sub-account tests: a family (a master and two sub-accounts, each with a key and
its signed client) and an unrelated family, all on factory-made assets."""

from __future__ import annotations

import pytest

from tests.subaccounts.helpers import Family, family_of
from tests.support.factories import AssetFactory


@pytest.fixture
def assets(db):
    return {code: AssetFactory(code=code) for code in ("BTC", "PHP", "USDT")}


@pytest.fixture
def family(assets) -> Family:
    return family_of("fam", master_funding={"BTC": "1", "PHP": "10000"}, sub_funding={"BTC": "0.5"})


@pytest.fixture
def other_family(assets) -> Family:
    return family_of("other", master_funding={"BTC": "1"}, sub_funding={"BTC": "0.25"})


@pytest.fixture(autouse=True)
def _roomy_rate_limits(settings):
    """Transfers weigh UID 100 and creation IP 60: a test makes more calls than a minute's limit
    allows (the limits themselves are tested in tests/security)."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
