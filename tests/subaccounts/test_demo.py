"""The demo world's family (issue 15, item 11): the master keeps two funded sub-accounts, one with
its own key that works, and is whitelisted for its sub-accounts' events; loading twice changes
nothing."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from accounts.ledger.check import ledger_check
from accounts.models import Balance, Posting, User
from tests.subaccounts import helpers as h
from tests.support.client import SignedClient

pytestmark = pytest.mark.django_db


def demo() -> dict:
    out = StringIO()
    call_command("demo", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_the_demo_master_has_two_funded_sub_accounts_and_sees_their_events():
    world = demo()
    master = User.objects.get(email=world["master"]["email"])
    assert master.is_whitelisted_master
    subs = list(master.sub_accounts.order_by("id"))
    # sub2 is virtual: named sub2@demo.exchange, its address in the reserved space (issue 25, finding 4).
    assert [s.email for s in subs] == ["sub1@demo.exchange", f"sub2_demo.exchange@m{master.pk}.virtual.invalid"]
    for sub in subs:
        assert Balance.objects.filter(account=sub, free__gt=0).count() >= 3, sub.email
    sub_client = SignedClient(world["sub"]["api_key"], world["sub"]["secret_key"])
    assert h.ok(sub_client.get(h.SUB_HISTORY))["result"] == []
    master_client = SignedClient(world["master"]["api_key"], world["master"]["secret_key"])
    listed = h.ok(master_client.get(h.LIST))
    assert listed["total"] == 2

    postings = Posting.objects.count()
    demo()
    assert Posting.objects.count() == postings
    assert ledger_check().ok
