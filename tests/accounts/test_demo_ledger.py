"""The demo world's money (funded once, through the ledger) and the ledger check: function,
command, periodic task and its admin page."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from accounts.ledger.check import ledger_check
from accounts.models import Balance, Entry, LedgerCheckRun, Posting, SystemRole, User
from accounts.tasks import ledger_check_task
from tests.support.client import SignedClient

pytestmark = pytest.mark.django_db

MINIMUM_MASTER = {"BTC": Decimal("10"), "ETH": Decimal("100"), "USDT": Decimal("100000"), "PHP": Decimal("1000000")}


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def demo() -> dict:
    return json.loads(run("demo", "--json"))


def balances(email: str) -> dict[str, tuple[Decimal, Decimal]]:
    return {
        row.asset.code: (row.free, row.locked)
        for row in Balance.objects.filter(account__email=email).select_related("asset")
    }


def all_balances() -> list[tuple]:
    return sorted(Balance.objects.values_list("account_id", "asset_id", "free", "locked"))


def test_demo_funds_master_sub_and_peer():
    world = demo()
    master = balances(world["master"]["email"])
    assert set(master) == set(MINIMUM_MASTER)
    for code, minimum in MINIMUM_MASTER.items():
        free, locked = master[code]
        assert free >= minimum, (code, free)
        assert locked == 0
    for role in ("sub", "peer"):
        held = balances(world[role]["email"])
        assert set(held) == set(MINIMUM_MASTER), role
        for code, (free, locked) in held.items():
            assert free > 0, (role, code)
            assert locked == 0, (role, code)


def test_demo_funding_comes_from_the_equity_account():
    demo()
    equity = User.objects.get(system_role=SystemRole.EQUITY)
    held = balances(equity.email)
    customers = Balance.objects.exclude(account=equity)
    for code, (free, locked) in held.items():
        total = sum(b.free + b.locked for b in customers.filter(asset__code=code))
        assert free == -total, code
        assert locked == 0
    # one posting per account and asset, each a credit of the account and a debit of equity
    postings = Posting.objects.filter(reference__startswith="demo:fund:")
    assert postings.count() == 12 + 3  # master, sub1, peer: 4 assets each; sub2 (subaccounts.demo): 3
    for posting in postings:
        sides = sorted(posting.entries.values_list("account_id", "side"), key=lambda row: row[1])
        assert sides[0] == (equity.pk, -1)
        assert sides[1][1] == 1
        assert posting.kind == "DISTRIBUTION"


def test_demo_twice_funds_once():
    first = demo()
    balances_after_first = all_balances()
    postings, entries = Posting.objects.count(), Entry.objects.count()
    second = demo()
    assert second == first
    assert all_balances() == balances_after_first
    assert (Posting.objects.count(), Entry.objects.count()) == (postings, entries)
    assert ledger_check().ok


def test_demo_balances_are_seen_through_the_api():
    world = demo()
    client = SignedClient(world["master"]["api_key"], world["master"]["secret_key"])
    response = client.get("/openapi/v1/account")
    assert response.status_code == 200, response.content
    seen = {row["asset"]: row["free"] for row in response.json()["balances"]}
    assert Decimal(seen["BTC"]) >= 10
    assert Decimal(seen["ETH"]) >= 100
    assert Decimal(seen["USDT"]) >= 100000
    assert Decimal(seen["PHP"]) >= 1000000
    sub = SignedClient(world["sub"]["api_key"], world["sub"]["secret_key"])
    crypto = sub.get("/openapi/account/v3/crypto-accounts", {"recvWindow": 5000, "currency": "BTC"})
    assert crypto.status_code == 200, crypto.content
    [item] = crypto.json()["crypto-accounts"]
    assert Decimal(item["balance"]) > 0


def test_ledger_check_after_demo_is_ok():
    demo()
    result = ledger_check()
    assert result.ok, result.report()
    assert result.postings == Posting.objects.count() >= 12
    assert result.balances == Balance.objects.count()


def test_ledger_check_command_prints_ok():
    demo()
    output = run("ledger_check")
    assert "OK" in output
    assert f"{Posting.objects.count()} postings" in output
    assert not LedgerCheckRun.objects.exists()  # only --record stores a result


def test_ledger_check_command_record_stores_a_run():
    demo()
    run("ledger_check", "--record")
    check_run = LedgerCheckRun.objects.get()
    assert check_run.ok is True
    assert check_run.postings == Posting.objects.count()
    assert check_run.balances == Balance.objects.count()
    assert "OK" in check_run.report
    assert check_run.finished_at >= check_run.started_at


def test_ledger_check_task_records_a_run_visible_in_the_admin():
    demo()
    assert ledger_check_task.delay().get() is True
    check_run = LedgerCheckRun.objects.get()
    assert check_run.ok is True
    assert check_run.postings == Posting.objects.count()

    root = User.objects.create_superuser(email="root@demo-check.example", password="pw-for-tests")
    client = Client()
    client.force_login(root)
    page = client.get(reverse("admin:accounts_ledgercheckrun_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert reverse("admin:accounts_ledgercheckrun_change", args=[check_run.pk]) in html
    detail = client.get(reverse("admin:accounts_ledgercheckrun_change", args=[check_run.pk]))
    assert detail.status_code == 200
    assert "OK (every balance and limit counter equals its journal" in detail.content.decode()
