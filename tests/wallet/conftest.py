import pytest

from tests.conftest import SignedClient


@pytest.fixture
def master_client(demo):
    return SignedClient(demo["master"]["api_key"], demo["master"]["secret_key"])
