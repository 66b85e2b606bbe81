"""Virtual sub-accounts made before their own address space move into it (subaccounts migration
0003; issue 25, finding 4): the squatted e-mail is freed for its real owner, and the master keeps
calling the sub-account by its old e-mail."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from accounts.models import User
from tests.support.factories import AssetFactory, customer

migration = importlib.import_module("subaccounts.migrations.0003_virtual_addresses")
ASSET = "/openapi/v1/sub-account/asset"


@pytest.fixture
def squatter(db):
    AssetFactory(code="PHP")
    master = customer(funding={"PHP": "100"})
    old = customer(master=master.user, is_virtual=True, email="ceo@bigbank.example", funding={"PHP": "7"})
    return master, old


def test_a_squatted_e_mail_moves_into_the_virtual_space(squatter):
    master, old = squatter
    real_sibling = customer(master=master.user, is_virtual=False, email="desk@bigbank.example")
    migration.move_into_the_virtual_space(apps, None)
    moved = User.objects.get(pk=old.user.pk)
    assert moved.email == f"ceo_bigbank.example@m{master.user.pk}.virtual.invalid"
    assert User.objects.get(pk=real_sibling.user.pk).email == "desk@bigbank.example"  # not virtual: kept
    migration.move_into_the_virtual_space(apps, None)  # twice: nothing more moves
    assert User.objects.get(pk=old.user.pk).email == moved.email

    # the master still names it by the old e-mail, and by its new address
    for name in ("ceo@bigbank.example", moved.email):
        response = master.client.get(ASSET, {"email": name})
        assert response.status_code == 200, response.content
        assert {b["asset"]: b["free"] for b in response.json()["balances"]}["PHP"] in {"7", "7.00"}

    # and the real owner of the e-mail can now be a customer
    real = customer(email="ceo@bigbank.example")
    assert real.user.pk != old.user.pk
