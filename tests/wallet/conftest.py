import pytest

from tests.support.client import SignedClient


@pytest.fixture
def master_client(demo):
    """The demo master's signed client (the wallet's smoke tests run on the demo world)."""
    return SignedClient(demo["master"]["api_key"], demo["master"]["secret_key"])
