"""The ledger's admin: assets are edited; balances, postings (with their entries), the change feed
and check results are read-only; money moves only through manual adjustments, proposed on the form
and confirmed by a second staff member (tests/backoffice/test_four_eyes.py tests the rule itself)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.models import ManualAdjustment
from accounts.models import Asset, Balance, BalanceChange, Entry, LedgerCheckRun, Posting, SystemRole, User
from tests.support.staff import ADMINISTRATOR, staff_member
from tests.support.staff import logged_in as _client
from tests.support.staff import staff_in as _staff_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser(db) -> User:
    return User.objects.create_superuser(email="root@ledger-staff.example", password="pw-for-tests")


@pytest.fixture
def root(superuser) -> Client:
    return _client(superuser)


@pytest.fixture
def ops_user(make_user) -> User:
    return _staff_in(make_user, "Administrator")


@pytest.fixture
def ops(ops_user) -> Client:
    return _client(ops_user)


@pytest.fixture
def support(make_user) -> Client:
    return _client(_staff_in(make_user, "Support"))


@pytest.fixture
def btc(db) -> Asset:
    return Asset.objects.create(
        code="BTC",
        name="Bitcoin",
        transfer_precision=8,
        transfer_min_quantity=Decimal("0.00001"),
        reference_price=Decimal("5000000"),
    )


@pytest.fixture
def customer(make_user, btc) -> User:
    """An account holding 1.5 BTC free and 0.5 BTC locked."""
    user = make_user()
    world = ledger.system_account_id(SystemRole.WORLD)
    ledger.post(legs=ledger.move(world, user.id, "BTC", Decimal("2")), kind="CHAIN_DEPOSIT", reference="adm:dep")
    ledger.post(legs=ledger.hold(user.id, "BTC", Decimal("0.5")), kind="CHAIN_WITHDRAWAL", reference="adm:hold")
    return user


def _balance(user_id: int, code: str = "BTC") -> tuple[Decimal, Decimal]:
    row = Balance.objects.filter(account_id=user_id, asset__code=code).first()
    return (row.free, row.locked) if row else (Decimal(0), Decimal(0))


def _url(model: str, view: str, *args) -> str:
    return reverse(f"admin:accounts_{model}_{view}", args=args)


def _has_input(html: str, name: str) -> bool:
    return f'name="{name}"' in html


def _snapshot():
    return (
        Posting.objects.count(),
        Entry.objects.count(),
        BalanceChange.objects.count(),
        ManualAdjustment.objects.count(),
        sorted(Balance.objects.values_list("account_id", "asset_id", "free", "locked")),
    )


# --- assets --------------------------------------------------------------------------------------


ASSET_FORM = {
    "code": "ETH",
    "name": "Ethereum",
    "transfer_precision": "8",
    "transfer_min_quantity": "0.0001",
    "reference_price": "200000",
    "reason": "listing approved by the asset committee",
    "_save": "Save",
}


@pytest.mark.parametrize("who", ["root", "ops"])
def test_asset_add_and_change(request, who):
    client = request.getfixturevalue(who)
    assert client.get(_url("asset", "add")).status_code == 200
    response = client.post(_url("asset", "add"), ASSET_FORM)
    assert response.status_code == 302, response.content[:1000]
    asset = Asset.objects.get(code="ETH")
    assert (asset.name, asset.transfer_precision, asset.is_fiat) == ("Ethereum", 8, False)
    assert asset.transfer_min_quantity == Decimal("0.0001")
    assert asset.reference_price == Decimal("200000")

    page = client.get(_url("asset", "change", asset.pk))
    assert page.status_code == 200
    assert not _has_input(page.content.decode(), "code")  # the code never changes once created
    response = client.post(
        _url("asset", "change", asset.pk),
        {**ASSET_FORM, "code": "XXX", "name": "Ether", "reference_price": "210000.5", "is_fiat": ""},
    )
    assert response.status_code == 302, response.content[:1000]
    asset.refresh_from_db()
    assert asset.code == "ETH"
    assert asset.name == "Ether"
    assert asset.reference_price == Decimal("210000.5")
    assert client.get(_url("asset", "changelist")).status_code == 200


def test_assets_cannot_be_deleted(root, btc):
    assert root.get(_url("asset", "delete", btc.pk)).status_code == 403
    assert root.post(_url("asset", "delete", btc.pk), {"post": "yes"}).status_code == 403
    assert Asset.objects.filter(pk=btc.pk).exists()


def test_support_cannot_add_an_asset(support):
    assert support.get(_url("asset", "add")).status_code == 403
    assert support.post(_url("asset", "add"), ASSET_FORM).status_code == 403
    assert not Asset.objects.filter(code="ETH").exists()


# --- read-only pages -----------------------------------------------------------------------------


def _read_only_pages(client: Client, model: str, obj_pk: int, field_names: list[str]) -> None:
    assert client.get(_url(model, "changelist")).status_code == 200
    assert client.get(_url(model, "add")).status_code == 403
    assert client.post(_url(model, "add"), {}).status_code == 403
    page = client.get(_url(model, "change", obj_pk))
    assert page.status_code == 200
    html = page.content.decode()
    for name in field_names:
        assert not _has_input(html, name), (model, name)
    assert 'name="_save"' not in html
    assert client.post(_url(model, "change", obj_pk), {}).status_code == 403
    assert client.get(_url(model, "delete", obj_pk)).status_code == 403
    assert client.post(_url(model, "delete", obj_pk), {"post": "yes"}).status_code == 403


@pytest.mark.parametrize("who", ["root", "ops", "support"])
def test_balance_pages_are_read_only(request, who, customer):
    client = request.getfixturevalue(who)
    before = _snapshot()
    balance = Balance.objects.get(account=customer)
    _read_only_pages(client, "balance", balance.pk, ["free", "locked", "account", "asset"])
    assert _snapshot() == before


@pytest.mark.parametrize("who", ["root", "ops"])
def test_posting_pages_are_read_only_with_their_entries_shown(request, who, customer):
    client = request.getfixturevalue(who)
    before = _snapshot()
    posting = Posting.objects.get(reference="adm:dep")
    _read_only_pages(client, "posting", posting.pk, ["kind", "reference", "memo"])
    html = client.get(_url("posting", "change", posting.pk)).content.decode()
    # The entries inline: shown, not editable, nothing to add or delete.
    assert "2.000000000000000000" in html or "2.00000000" in html
    assert "View posting" in html
    for name in ("entries-0-amount", "entries-0-side", "entries-0-account", "entries-0-DELETE"):
        assert not _has_input(html, name), name
    assert _snapshot() == before


@pytest.mark.parametrize("who", ["root", "ops"])
def test_balance_change_pages_are_read_only(request, who, customer):
    client = request.getfixturevalue(who)
    before = _snapshot()
    change = BalanceChange.objects.filter(account=customer).first()
    _read_only_pages(client, "balancechange", change.pk, ["delta_free", "free_after", "seq", "published_at"])
    assert _snapshot() == before


@pytest.mark.parametrize("who", ["root", "ops"])
def test_ledger_check_run_pages_are_read_only(request, who, customer):
    client = request.getfixturevalue(who)
    ledger_check(record=True)
    run = LedgerCheckRun.objects.get()
    _read_only_pages(client, "ledgercheckrun", run.pk, ["ok", "report", "postings"])
    assert LedgerCheckRun.objects.get().ok is True


def test_posting_changelist_lists_postings(root, customer):
    html = root.get(_url("posting", "changelist")).content.decode()
    assert "adm:dep" in html
    assert "adm:hold" in html


# --- manual adjustments --------------------------------------------------------------------------


def _adjust(
    client: Client,
    account: User,
    asset: Asset,
    amount: str,
    reason: str = "goodwill credit",
    request_id=None,
    confirmer: Client | None = None,
    **kw,
):
    """Propose on the form as `client`; once proposed, confirm as `confirmer` (by default another
    Administrator): the four-eyes flow. Returns the proposal's response when it was refused, else
    the confirmation's."""
    data = {"account": account.pk, "asset": asset.pk, "amount": amount, "reason": reason, "_save": "Save"}
    if request_id is not None:
        data["request_id"] = request_id
    proposed = client.post(_url("manualadjustment", "add"), data)
    if proposed.status_code != 302:
        return proposed
    adjustment = ManualAdjustment.objects.order_by("-id").first()
    confirmer = confirmer or _client(staff_member(ADMINISTRATOR))
    decide = reverse("admin:accounts_manualadjustment_decide", args=[adjustment.pk])
    return confirmer.post(decide, {"decision": "confirm", "reason": "checked"}, **kw)


@pytest.mark.parametrize("who", ["root", "ops"])
def test_adjustment_credit_posts_against_equity(request, who, customer, btc):
    client = request.getfixturevalue(who)
    actor = request.getfixturevalue("superuser" if who == "root" else "ops_user")
    equity = ledger.system_account_id(SystemRole.EQUITY)
    equity_before = _balance(equity)
    assert client.get(_url("manualadjustment", "add")).status_code == 200

    response = _adjust(client, customer, btc, "0.25", reason="ticket 42: missed deposit")
    assert response.status_code == 302, response.content[:2000]

    assert _balance(customer.id) == (Decimal("1.75"), Decimal("0.5"))
    assert _balance(equity) == (equity_before[0] - Decimal("0.25"), equity_before[1])
    adjustment = ManualAdjustment.objects.get()
    assert adjustment.account == customer
    assert adjustment.asset == btc
    assert adjustment.amount == Decimal("0.25")
    assert adjustment.reason == "ticket 42: missed deposit"
    assert adjustment.created_by == actor
    assert adjustment.decided_by not in (None, actor)  # confirmed by a second staff member
    posting = adjustment.posting
    assert posting.kind == "OTHERS"
    assert "ticket 42: missed deposit" in posting.memo
    assert adjustment.decided_by.email in posting.memo
    assert posting.actor_id == adjustment.decided_by_id
    entries = sorted(posting.entries.values_list("account_id", "bucket", "side", "amount"))
    assert entries == sorted([(customer.id, "F", 1, Decimal("0.25")), (equity, "F", -1, Decimal("0.25"))])
    assert ledger_check().ok

    # The adjustment is listed and can be looked at, never changed or deleted.
    assert client.get(_url("manualadjustment", "changelist")).status_code == 200
    page = client.get(_url("manualadjustment", "change", adjustment.pk))
    assert page.status_code == 200
    assert not _has_input(page.content.decode(), "amount")
    assert client.post(_url("manualadjustment", "change", adjustment.pk), {"amount": "9"}).status_code == 403
    assert client.post(_url("manualadjustment", "delete", adjustment.pk), {"post": "yes"}).status_code == 403
    adjustment.refresh_from_db()
    assert adjustment.amount == Decimal("0.25")


def test_adjustment_debit_within_free_balance(ops, ops_user, customer, btc):
    equity = ledger.system_account_id(SystemRole.EQUITY)
    response = _adjust(ops, customer, btc, "-1.5", reason="duplicate credit reversed")
    assert response.status_code == 302, response.content[:2000]
    assert _balance(customer.id) == (Decimal("0"), Decimal("0.5"))
    posting = ManualAdjustment.objects.get().posting
    entries = sorted(posting.entries.values_list("account_id", "side", "amount"))
    assert entries == sorted([(customer.id, -1, Decimal("1.5")), (equity, 1, Decimal("1.5"))])
    assert ledger_check().ok


def test_adjustment_debit_beyond_free_balance_is_refused_and_changes_nothing(ops, customer, btc):
    before = _snapshot()
    # 1.5 free (0.5 more is locked): a debit of 1.6 is refused even though free + locked = 2.
    response = _adjust(ops, customer, btc, "-1.6", reason="too much", follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Refused: the account&#x27;s free balance is smaller than the debit." in html or (
        "free balance is smaller than the debit" in html
    )
    messages = [str(m) for m in response.context["messages"]]
    assert any("free balance is smaller than the debit" in m for m in messages), messages
    after = _snapshot()
    assert after[:3] + after[4:] == before[:3] + before[4:]  # no posting, entry, change or balance
    assert ManualAdjustment.objects.get().status == "PROPOSED"  # the refused confirmation left it proposed
    assert _balance(customer.id) == (Decimal("1.5"), Decimal("0.5"))
    assert ledger_check().ok


@pytest.mark.parametrize(
    ("amount", "reason", "field"),
    [("0", "nothing", "amount"), ("1", "", "reason"), ("abc", "bad", "amount")],
)
def test_adjustment_form_errors_change_nothing(ops, customer, btc, amount, reason, field):
    before = _snapshot()
    response = _adjust(ops, customer, btc, amount, reason=reason)
    assert response.status_code == 200  # the form again, with its error
    assert field in response.context["adminform"].form.errors
    assert _snapshot() == before


def test_adjusting_the_equity_account_itself_is_refused_without_a_server_error(superuser, btc):
    """The equity account is the other side of every adjustment: picking it as the account gives
    a posting that moves nothing. The form must refuse it (form error or message), not fail with 500."""
    equity = User.objects.get(pk=ledger.system_account_id(SystemRole.EQUITY))
    before = _snapshot()
    client = Client(raise_request_exception=False)
    client.force_login(superuser)
    response = _adjust(client, equity, btc, "1", reason="not allowed", follow=True)
    assert response.status_code == 200, response.status_code
    assert _snapshot() == before


def test_zero_adjustment_message(ops, customer, btc):
    response = _adjust(ops, customer, btc, "0")
    assert b"An adjustment must move something." in response.content


def test_support_cannot_add_an_adjustment(support, customer, btc):
    before = _snapshot()
    assert support.get(_url("manualadjustment", "add")).status_code == 403
    assert _adjust(support, customer, btc, "1").status_code == 403
    assert _snapshot() == before
    assert support.get(_url("manualadjustment", "changelist")).status_code == 200


def test_staff_without_a_role_sees_nothing_of_the_ledger(make_user, customer, btc):
    client = _client(make_user(is_staff=True))
    for model in ("balance", "posting", "manualadjustment", "asset"):
        assert client.get(_url(model, "changelist")).status_code == 403, model
    assert _adjust(client, customer, btc, "1").status_code == 403
    assert not ManualAdjustment.objects.exists()


def test_ledger_check_after_many_adjustments(root, customer, btc, make_user):
    other = make_user()
    for account, amount in ((customer, "0.1"), (other, "3"), (customer, "-0.05"), (other, "-1")):
        assert _adjust(root, account, btc, amount).status_code == 302
    assert _balance(customer.id) == (Decimal("1.55"), Decimal("0.5"))
    assert _balance(other.id) == (Decimal("2"), Decimal("0"))
    assert ManualAdjustment.objects.count() == 4
    result = ledger_check()
    assert result.ok, result.report()


def test_the_same_adjustment_form_submitted_twice_posts_once(ops, customer, btc):
    """The form carries a request id made when it is shown; a double submit (or a resend after a
    timeout) of that form returns the first adjustment and moves nothing more."""
    page = ops.get(_url("manualadjustment", "add")).content.decode()
    assert 'name="request_id"' in page
    request_id = str(uuid.uuid4())
    for _ in range(2):
        response = _adjust(ops, customer, btc, "0.25", reason="ticket 43", request_id=request_id)
        assert response.status_code == 302, response.content[:2000]
    assert ManualAdjustment.objects.count() == 1
    assert _balance(customer.id) == (Decimal("1.75"), Decimal("0.5"))
    assert ledger_check().ok
    # Another form (another request id) is another adjustment.
    assert _adjust(ops, customer, btc, "0.25", reason="ticket 44", request_id=str(uuid.uuid4())).status_code == 302
    assert ManualAdjustment.objects.count() == 2
    assert _balance(customer.id) == (Decimal("2.00"), Decimal("0.5"))


def test_adjustment_service_with_a_request_id_is_idempotent(superuser, customer, btc):
    from accounts.ledger.services import adjustment_confirm, adjustment_propose

    request_id = uuid.uuid4()
    first = adjustment_propose(
        account=customer, asset=btc, amount=Decimal("1"), reason="r", proposed_by=superuser, request_id=request_id
    )
    again = adjustment_propose(
        account=customer, asset=btc, amount=Decimal("1"), reason="r", proposed_by=superuser, request_id=request_id
    )
    assert again.pk == first.pk
    assert ManualAdjustment.objects.count() == 1
    assert first.posting_id is None  # proposed: nothing posted yet
    adjustment_confirm(adjustment_id=first.pk, confirmed_by=staff_member(ADMINISTRATOR), reason="ok")
    assert _balance(customer.id) == (Decimal("2.5"), Decimal("0.5"))
    assert ledger_check().ok
