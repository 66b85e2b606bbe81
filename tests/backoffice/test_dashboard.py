"""The operations dashboard (exchange/dashboard): its numbers equal the ledger's, its queues count
what waits for a person and link to lists that show exactly those rows, a failed or overdue ledger
check is shown in red, and only staff with view access see it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import LedgerCheckRun
from accounts.models import SystemRole, User
from exchange.api.models import RateLimitBan
from exchange.backoffice.roles import SUPPORT
from exchange.dashboard import activity
from exchange.dashboard.models import ActivityRollup, DailyActivity
from exchange.platform import services as exchange_services
from subaccounts.models import CollectionStatus, FundCollection
from tests.support.assertions import assert_ledger_balanced
from tests.support.backoffice import trx_withdrawal
from tests.support.factories import UserFactory, convert_markets, demo_accounts, deposit, fund
from tests.support.staff import logged_in, staff_member
from wallet import deposits as wallet_deposits
from wallet.models import Deposit, DepositStatus, Network, Withdrawal, WithdrawalStage

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("backoffice:dashboard")


@pytest.fixture(autouse=True)
def _settings(settings):
    """Travel rule off unless a test sets a threshold; withdrawals need no approval unless one does."""
    settings.TRAVEL_RULE_THRESHOLD = Decimal(0)
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal(10**9)


@pytest.fixture
def support(db) -> Client:
    return logged_in(staff_member(SUPPORT))


@pytest.fixture
def master(db) -> User:
    """The demo's master among the demo's accounts, networks and whitelist (the factories' demo_accounts)."""
    return User.objects.get(email=demo_accounts(wallet=True)["master"]["email"])


def _positions_by_direct_query() -> dict[str, dict[str, Decimal]]:
    """What the page must show, summed here straight from the balance table with SQL of its own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.code, COALESCE(u.system_role, 'customers'), SUM(b.free), SUM(b.locked)"
            " FROM accounts_balance b JOIN accounts_asset a ON a.id = b.asset_id"
            " JOIN accounts_user u ON u.id = b.account_id GROUP BY a.code, COALESCE(u.system_role, 'customers')"
        )
        out: dict[str, dict[str, Decimal]] = {}
        for code, owner, free, locked in cursor.fetchall():
            row = out.setdefault(code, {})
            if owner == "customers":
                row["customers_free"], row["customers_locked"] = free, locked
            else:
                row[owner] = free + locked
    return out


def _cell(html: str, asset: str, field: str) -> Decimal:
    row = re.search(rf'<tr data-asset="{asset}">(.*?)</tr>', html, re.S).group(1)
    return Decimal(re.search(rf'data-field="{field}">([^<]*)<', row).group(1).strip())


def test_liabilities_and_house_accounts_equal_the_ledger(master, support):
    convert_markets()  # the house's convert liquidity: one more role with balances
    deposit(master, "2.5", "BTC")
    trx_withdrawal(master, "10")  # held: locked until it settles
    response = support.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    expected = _positions_by_direct_query()
    shown = {p.code: p for p in response.context["positions"]}
    assert set(expected) <= set(shown)
    for code, want in expected.items():
        position = shown[code]
        assert position.customers_free == want.get("customers_free", 0), code
        assert position.customers_locked == want.get("customers_locked", 0), code
        for role in SystemRole.values:
            assert position.house[role] == want.get(role, 0), (code, role)
        assert position.book_sum == 0, code  # the book balances: customers + house = 0
        # ...and the page prints the same numbers
        assert _cell(html, code, "customers_free") == position.customers_free
        assert _cell(html, code, "customers_locked") == position.customers_locked
        assert _cell(html, code, "world") == position.house["world"]
        assert _cell(html, code, "book_sum") == 0
    assert shown["USDT"].customers_locked >= Decimal(10)
    assert_ledger_balanced()


def _activity(client: Client, day=None) -> dict:
    day = (day or datetime.now(UTC).date()).isoformat()
    rows = client.get(DASHBOARD).context["activity_rows"]
    return {(r["category"], r["asset"]): (r["count"], r["volume"]) for r in rows if r["day"].isoformat() == day}


def test_activity_counts_and_volumes_of_each_kind(master, support, settings, django_capture_on_commit_callbacks):
    other = UserFactory()
    before = _activity(support)
    deposit(master, "1.25", "BTC")
    deposit(other, "0.75", "BTC")
    with django_capture_on_commit_callbacks(execute=True):  # queued, broadcast and settled by the eager task
        withdrawal = trx_withdrawal(master, "10")
    withdrawal.refresh_from_db()
    assert withdrawal.stage == WithdrawalStage.SUCCEEDED
    fund(master, "PHP", "100")  # a DISTRIBUTION from equity: not a deposit
    ledger.post(legs=ledger.move(master.id, other.id, "PHP", Decimal("30")), kind="P2P_TRANSFER", reference="t:1")
    after = _activity(support)

    def delta(category, asset):
        count, volume = after.get((category, asset), (0, Decimal(0)))
        count0, volume0 = before.get((category, asset), (0, Decimal(0)))
        return count - count0, volume - volume0

    assert delta("deposits", "BTC") == (2, Decimal("2.00"))
    assert delta("withdrawals", "USDT") == (1, Decimal("10"))  # what was sent; the fee went to fees
    assert delta("transfers", "PHP") == (1, Decimal("30"))
    assert delta("deposits", "PHP") == (0, 0)  # funding from equity is not a deposit
    chart = support.get(DASHBOARD).context["activity_chart"]
    assert len(chart["labels"]) == 30
    assert chart["labels"][-1] == datetime.now(UTC).date().isoformat()
    assert chart["counts"]["deposits"][-1] == sum(c for (cat, _), (c, _) in after.items() if cat == "deposits")
    assert chart["volumes"]["BTC"]["deposits"][-1] == str(after[("deposits", "BTC")][1])
    assert_ledger_balanced()


def test_the_rollup_and_the_tail_add_up_to_the_journal(master, support, settings):
    """Folding moves postings from the tail (read live) to the rollup; the page shows the same
    numbers before and after, and a rebuild from the whole journal gives the same rollup."""
    settings.DASHBOARD_ROLLUP_LAG_SECONDS = 0
    deposit(master, "1", "BTC")
    unfolded = _activity(support)
    assert activity.activity_fold() > 0
    assert ActivityRollup.objects.get().folded_through == ledger_max_posting()
    assert _activity(support) == unfolded
    deposit(master, "2", "BTC")  # a tail again, on top of the rollup
    mixed = _activity(support)
    assert mixed[("deposits", "BTC")][0] == unfolded[("deposits", "BTC")][0] + 1
    rows = sorted(DailyActivity.objects.values_list("day", "category", "asset_id", "count", "volume"))
    activity.activity_fold()
    activity.activity_rebuild()
    assert _activity(support) == mixed
    assert len(sorted(DailyActivity.objects.values_list("day", "category", "asset_id", "count", "volume"))) >= len(rows)


def test_the_fold_leaves_postings_younger_than_the_lag(master, settings):
    settings.DASHBOARD_ROLLUP_LAG_SECONDS = 3600
    deposit(master, "1", "BTC")
    activity.activity_fold()
    assert (ActivityRollup.objects.get().folded_through or 0) < ledger_max_posting()


def test_the_page_folds_a_long_tail_itself(master, support, settings):
    settings.DASHBOARD_ROLLUP_LAG_SECONDS = 0
    settings.DASHBOARD_FOLD_IN_VIEW_POSTINGS = 0
    deposit(master, "1", "BTC")
    support.get(DASHBOARD)
    assert ActivityRollup.objects.get().folded_through == ledger_max_posting()


def ledger_max_posting() -> int:
    from accounts.ledger.models import Posting

    return Posting.objects.order_by("-id").values_list("id", flat=True).first()


# --- queues ----------------------------------------------------------------------------------------


def test_queues_count_and_link_to_exactly_their_rows(master, support, settings):
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal("100")  # PHP; 10 USDT is above it
    awaiting = [trx_withdrawal(master, "10"), trx_withdrawal(master, "11")]
    assert {w.stage for w in awaiting} == {WithdrawalStage.AWAITING_APPROVAL}
    settings.WITHDRAWAL_APPROVAL_THRESHOLD = Decimal(10**9)
    stuck, fresh = trx_withdrawal(master, "12"), trx_withdrawal(master, "13")  # QUEUED (their tasks are not run here)
    # A worker died after taking them (BROADCASTING); one of them long enough ago to be past the retry time.
    old = timezone.now() - timedelta(seconds=settings.WITHDRAWAL_RETRY_AFTER_SECONDS + 60)
    Withdrawal.objects.filter(pk=stuck.pk).update(stage=WithdrawalStage.BROADCASTING, updated_at=old)
    Withdrawal.objects.filter(pk=fresh.pk).update(stage=WithdrawalStage.BROADCASTING)
    settings.TRAVEL_RULE_THRESHOLD = Decimal("1000")
    network = Network.objects.get(coin__code="USDT", network="TRX")
    address = wallet_deposits.deposit_address_get(account=master, coin="USDT", network="TRX")
    held = wallet_deposits.deposit_record(
        network=network,
        tx_id="tx-travel",
        output_index=0,
        address=address.address,
        tag=address.tag,
        amount=Decimal("50"),
        confirmations=1,
    )
    assert held.status == DepositStatus.NEED_FILL_DATA
    now = timezone.now()
    for status in (CollectionStatus.INIT, CollectionStatus.PROCESSING, CollectionStatus.SUCCESS):
        FundCollection.objects.create(
            master=UserFactory(), client_request_id=f"c-{status}", status=status, created_at=now, updated_at=now
        )

    queues = {q.name: q for q in support.get(DASHBOARD).context["queues"]}
    expected = {
        "Withdrawals awaiting approval": ({w.pk for w in awaiting}, "wallet", "withdrawal"),
        "Deposits waiting for travel-rule data (NEED_FILL_DATA)": ({held.pk}, "wallet", "deposit"),
        "Withdrawals stuck in BROADCASTING past the retry time": ({stuck.pk}, "wallet", "withdrawal"),
        "Collection tasks not finished": (
            set(FundCollection.objects.filter(status__in=["INIT", "PROCESSING"]).values_list("pk", flat=True)),
            "subaccounts",
            "fundcollection",
        ),
    }
    assert set(queues) == set(expected)
    for name, (pks, app, model) in expected.items():
        queue = queues[name]
        assert queue.count == len(pks), name
        assert queue.url.startswith(reverse(f"admin:{app}_{model}_changelist") + "?"), name
        listed = support.get(queue.url)
        assert listed.status_code == 200, (name, queue.url)
        assert "?e=1" not in listed.get("Location", ""), (name, "the admin refused the filter")
        assert {obj.pk for obj in listed.context["cl"].result_list} == pks, name
    assert Deposit.objects.filter(status=DepositStatus.NEED_FILL_DATA).count() == 1
    assert_ledger_balanced()


# --- ledger check, switches, bans ---------------------------------------------------------------------


def _check_paragraph(client: Client) -> str:
    html = client.get(DASHBOARD).content.decode()
    return re.search(r'<p id="ledger-check" class="([^"]*)">(.*?)</p>', html, re.S).group(0)


def _record(ok: bool, started: datetime) -> LedgerCheckRun:
    return LedgerCheckRun.objects.create(started_at=started, finished_at=started, ok=ok, postings=3, balances=4)


def test_ledger_check_shown_and_red_when_failed_overdue_or_missing(support, settings):
    settings.CELERY_BEAT_SCHEDULE = {
        **settings.CELERY_BEAT_SCHEDULE,
        "ledger-check": {"task": "accounts.ledger_check", "schedule": 3600.0},
    }
    assert 'class="bo-alarm"' in _check_paragraph(support)
    assert "No ledger check recorded" in _check_paragraph(support)
    now = timezone.now()
    _record(True, now - timedelta(minutes=5))
    paragraph = _check_paragraph(support)
    assert 'class="bo-ok"' in paragraph
    assert "OK" in paragraph
    assert "overdue" not in paragraph
    LedgerCheckRun.objects.all().delete()
    _record(True, now - timedelta(hours=3))  # two hourly runs missed
    paragraph = _check_paragraph(support)
    assert 'class="bo-alarm"' in paragraph
    assert "overdue" in paragraph
    _record(False, now - timedelta(minutes=1))
    paragraph = _check_paragraph(support)
    assert 'class="bo-alarm"' in paragraph
    assert "DRIFT" in paragraph


def test_business_switches_and_active_bans(support):
    exchange_services.business_status_set(business_type="CONVERT", is_on=False)
    now = timezone.now()
    active = RateLimitBan.objects.create(
        ip="203.0.113.7", offence=1, duration_seconds=120, reason="429 ignored", expires_at=now + timedelta(minutes=2)
    )
    RateLimitBan.objects.create(  # expired
        ip="203.0.113.8", offence=1, duration_seconds=120, reason="429 ignored", expires_at=now - timedelta(minutes=1)
    )
    RateLimitBan.objects.create(  # lifted
        ip="203.0.113.9",
        offence=1,
        duration_seconds=120,
        reason="429 ignored",
        expires_at=now + timedelta(minutes=2),
        lifted_at=now,
    )
    response = support.get(DASHBOARD)
    statuses = {s.business_type: s.is_on for s in response.context["statuses"]}
    assert statuses == {"SPOT": True, "CONVERT": False}
    assert response.context["ban_count"] == 1
    assert [b.pk for b in response.context["bans"]] == [active.pk]
    html = response.content.decode()
    assert "203.0.113.7" in html
    assert "203.0.113.8" not in html
    assert re.search(r"<th>CONVERT</th><td class=\"bo-alarm\">OFF</td>", html)


# --- access -------------------------------------------------------------------------------------------


def test_only_staff_with_view_access_see_it(make_user, support):
    assert support.get(DASHBOARD).status_code == 200
    anonymous = Client().get(DASHBOARD)
    assert anonymous.status_code == 302
    assert "/admin/login/" in anonymous["Location"]
    customer = logged_in(make_user())
    assert customer.get(DASHBOARD).status_code == 302  # not staff: the admin's login page
    bare_staff = logged_in(make_user(is_staff=True))  # staff, but in no role: no view permission
    assert bare_staff.get(DASHBOARD).status_code == 403


def test_the_home_is_the_dashboard_with_the_model_index_one_click_away(support, make_user):
    # Issue 26: staff land on the dashboard (admin:index, where the login sends them), not on
    # Django's model index, which is linked from it.
    home = support.get(reverse("admin:index"))
    assert home.status_code == 200
    html = home.content.decode()
    assert 'id="dashboard"' in html
    assert 'id="ledger-check"' in html
    assert 'id="queues"' in html
    assert f'id="all-models" href="{reverse("admin:models")}"' in html
    # Staff without the dashboard's permission get the model index as their home, not a 403.
    bare_staff = logged_in(make_user(is_staff=True))
    bare = bare_staff.get(reverse("admin:index"))
    assert bare.status_code == 200
    assert 'id="dashboard"' not in bare.content.decode()


def test_the_model_index_links_the_dashboard_first(support):
    html = support.get(reverse("admin:models")).content.decode()
    assert 'id="dashboard"' not in html
    assert html.index(DASHBOARD) < html.index("/admin/accounts/")
    assert reverse("backoffice:customer") in html


def test_the_chart_library_is_served_from_static_files(support):
    html = support.get(DASHBOARD).content.decode()
    assert "vendor/chartjs/chart.umd.min.js" in html
    assert "backoffice/dashboard.js" in html
    for src in re.findall(r'<script src="([^"]+)"', html):
        assert src.startswith("/"), src  # served by the service itself, never from the internet
