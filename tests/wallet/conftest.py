import json
from io import StringIO

import pytest
from django.core.management import call_command

from tests.conftest import SignedClient


@pytest.fixture
def demo(db):
    """The demo world: assets, networks, funded accounts, the master's whitelist."""
    out = StringIO()
    call_command("demo", "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def master_client(demo):
    return SignedClient(demo["master"]["api_key"], demo["master"]["secret_key"])
