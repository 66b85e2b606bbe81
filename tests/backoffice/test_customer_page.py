"""The customer page (exchange/dashboard): found by e-mail, phone or user id; shows the account's
balances (equal to the ledger's), its last postings with their entries, API keys without any secret,
sub-accounts, open withdrawals, transfers, conversions and listenKeys, each linked to its record;
only staff with view permission on accounts see it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from accounts.ledger.models import Balance, BalanceChange
from accounts.models import ApiKey, User
from convert import services as convert_services
from exchange.backoffice.roles import SUPPORT
from streams import services as stream_services
from tests.support.assertions import assert_ledger_balanced
from tests.support.factories import ApiKeyFactory, convert_markets, demo_accounts, deposit
from tests.support.staff import logged_in, staff_member
from wallet import withdrawals as wallet_withdrawals
from wallet.transfers import services as transfer_services

pytestmark = pytest.mark.django_db

SEARCH = reverse("backoffice:customer")
MASTER = "master@demo.exchange"
PHONE = "+639170000001"
TRX_ADDRESS = "TDemoMasterWhitezistAddress1111111"  # on the demo master's whitelist


@pytest.fixture
def support(db) -> Client:
    return logged_in(staff_member(SUPPORT))


@pytest.fixture
def master(db, settings) -> User:
    """The demo's master (its accounts, networks, whitelist and the convert markets, by the factories)."""
    settings.TRAVEL_RULE_THRESHOLD = Decimal(0)
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal(10**9)
    demo_accounts(wallet=True)
    convert_markets()
    return User.objects.get(email=MASTER)


@pytest.fixture
def busy_master(master) -> tuple[User, str]:
    """The demo master with a bit of everything; returns it and a fresh API key's secret."""
    _, secret = ApiKeyFactory(user=master, name="page-test")
    deposit(master, "0.5", "BTC")
    wallet_withdrawals.withdrawal_apply(
        account=master,
        coin="USDT",
        network="TRX",
        address=TRX_ADDRESS,
        tag="",
        amount=Decimal("10"),
        withdraw_order_id="page-open-1",
    )
    transfer_services.transfer_create(
        sender=master, asset_code="PHP", target_address="peer@demo.exchange", amount=Decimal("5")
    )
    quote = convert_services.quote_create(
        user=master, source_code="BTC", target_code="PHP", source_amount=Decimal("0.01")
    )
    convert_services.quote_accept(user=master, quote_id=quote.quote_id)
    stream_services.listen_key_start(account=master)
    return master, secret


@pytest.mark.parametrize("query", [MASTER, MASTER.upper(), PHONE, "id"])
def test_search_by_email_phone_or_id_opens_the_account(support, master, query):
    query = str(master.pk) if query == "id" else query
    response = support.get(SEARCH, {"q": query})
    assert response.status_code == 200
    assert response.context["customer"] == master
    assert f'href="{reverse("admin:accounts_user_change", args=[master.pk])}"' in response.content.decode()


def test_no_match_and_never_a_house_account(support, master):
    response = support.get(SEARCH, {"q": "nobody@nowhere.example"})
    assert response.status_code == 200
    assert "customer" not in response.context
    assert "No account matches" in response.content.decode()
    house = User.objects.filter(system_role__isnull=False).first()
    assert "customer" not in support.get(SEARCH, {"q": house.email}).context
    assert support.get(reverse("backoffice:customer_detail", args=[house.pk])).status_code == 404


def test_the_page_shows_the_account_and_links_each_record(support, busy_master):
    master, _ = busy_master
    response = support.get(reverse("backoffice:customer_detail", args=[master.pk]))
    assert response.status_code == 200
    context, html = response.context, response.content.decode()
    # balances: exactly the ledger's
    ledger_rows = {
        b.asset.code: (b.free, b.locked) for b in Balance.objects.filter(account=master).select_related("asset")
    }
    assert {b.asset.code: (b.free, b.locked) for b in context["balances"]} == ledger_rows
    assert ledger_rows["USDT"][1] >= Decimal("10")  # the open withdrawal's hold
    # last postings, newest first, each with all its entries
    latest = list(
        dict.fromkeys(
            BalanceChange.objects.filter(account=master).order_by("-seq").values_list("posting_id", flat=True)
        )
    )[:20]
    assert [p.posting.pk for p in context["postings"]] == latest
    for shown in context["postings"]:
        assert {e.pk for e in shown.entries} == set(shown.posting.entries.values_list("pk", flat=True))
        assert sum(e.side * e.amount for e in shown.entries) == 0
        assert reverse("admin:accounts_posting_change", args=[shown.posting.pk]) in html
    kinds = {p.posting.kind for p in context["postings"]}
    assert {"CHAIN_DEPOSIT", "CHAIN_WITHDRAWAL", "P2P_TRANSFER", "CONVERT"} <= kinds
    # the rest, each linked to its admin page
    assert [w.withdraw_order_id for w in context["open_withdrawals"]] == ["page-open-1"]
    assert reverse("admin:wallet_withdrawal_change", args=[context["open_withdrawals"][0].pk]) in html
    assert context["transfers"]
    assert reverse("admin:wallet_transfer_change", args=[context["transfers"][0].pk]) in html
    assert context["conversions"]
    assert reverse("admin:convert_order_change", args=[context["conversions"][0].pk]) in html
    assert context["listen_keys"]
    assert reverse("admin:streams_listenkey_change", args=[context["listen_keys"][0].pk]) in html
    subs = list(User.objects.filter(master=master))
    assert subs
    assert {s.pk for s in context["sub_accounts"]} == {s.pk for s in subs}
    for sub in subs:
        assert reverse("backoffice:customer_detail", args=[sub.pk]) in html
    for key in ApiKey.objects.filter(user=master):
        assert key.key in html
        assert reverse("admin:accounts_apikey_change", args=[key.pk]) in html
    assert_ledger_balanced()


def test_no_secret_on_the_page(support, busy_master):
    master, secret = busy_master
    html = support.get(SEARCH, {"q": MASTER}).content.decode()
    assert "page-test" in html  # the key is listed...
    assert secret not in html  # ...its secret never
    for ciphertext in ApiKey.objects.filter(user=master).values_list("secret_ciphertext", flat=True):
        assert ciphertext not in html
    for listen_key in master.listen_keys.values_list("key", flat=True):
        assert listen_key not in html  # a bearer credential for the stream: shown shortened


def test_a_sub_account_links_its_master(support, master):
    sub = User.objects.filter(master=master).first()
    response = support.get(reverse("backoffice:customer_detail", args=[sub.pk]))
    assert response.context["master"] == master
    assert reverse("backoffice:customer_detail", args=[master.pk]) in response.content.decode()


def test_only_staff_with_view_permission_on_accounts(make_user, master):
    url = reverse("backoffice:customer_detail", args=[master.pk])
    assert Client().get(url).status_code == 302  # the admin's login page
    assert logged_in(make_user()).get(url).status_code == 302  # a customer is not staff
    assert logged_in(make_user(is_staff=True)).get(url).status_code == 403  # staff without the permission
    assert logged_in(make_user(is_staff=True)).get(SEARCH, {"q": MASTER}).status_code == 403
