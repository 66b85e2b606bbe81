"""Transfers between accounts (spec: "Transfers between accounts", "Transfer", "Transfer record",
"Limits"): creation through v4 and the legacy v3 (every rule and refusal), queries, effects on
balances, the journal, the transaction history and both accounts' streams, and admin reversal.

Creating a transfer weighs 50 against the IP (120/min) and UID (180/min) limits, so every test here
raises them (autouse fixture) except the one that shows the limit itself."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from urllib.parse import quote, urlencode

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import Client

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.ledger.models import Asset, BusinessType, Entry, Posting
from accounts.models import Balance, LimitPeriod, LimitTier, SystemRole, TierLimit, User
from streams import services as stream_services
from tests.support.assertions import assert_error
from tests.support.client import SignedClient, now_ms
from tests.support.factories import demo_accounts
from tests.support.streams import communicator
from wallet.models import Transfer, TransferFee

V4 = "/openapi/transfer/v4/transfers"
V3 = "/openapi/transfer/v3/transfers"
MASTER = "master@demo.exchange"
MASTER_PHONE = "+639170000001"
PEER = "peer@demo.exchange"
PEER_PHONE = "+639170000002"
SUB = "sub1@demo.exchange"
BASE = {"account": "PHP", "target_address": PEER, "amount": "10"}
CREATED_FIELDS = {
    "id",
    "status",
    "account",
    "target_address",
    "amount",
    "fee_amount",
    "exchange",
    "payment",
    "client_transfer_id",
    "message",
    "errorMessage",
}
RECORD_FIELDS = {
    "id",
    "client_transfer_id",
    "account",
    "amount",
    "fee_amount",
    "currency",
    "payment",
    "status",
    "message",
    "target_address",
    "sourceAddress",
    "source_address",
    "type",
    "created_at",
}
OPTIONAL_RECORD_FIELDS = {"customSenderName"}


@pytest.fixture(autouse=True)
def world(db) -> dict[str, dict]:
    """The demo world's master, its sub-account and the peer, with their keys and funding (built by
    the factories: the transfers need no networks, markets or whitelist)."""
    return demo_accounts()


@pytest.fixture(autouse=True)
def _raised_limits(world, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 1_000_000
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000


@pytest.fixture
def master_client(world):
    return SignedClient(world["master"]["api_key"], world["master"]["secret_key"])


@pytest.fixture(params=[V4, V3], ids=["v4", "v3"])
def create_path(request):
    """Every creation rule holds for v4 and for the legacy v3."""
    return request.param


@pytest.fixture
def peer_client(world):
    return SignedClient(world["peer"]["api_key"], world["peer"]["secret_key"])


@pytest.fixture
def sub_client(world):
    return SignedClient(world["sub"]["api_key"], world["sub"]["secret_key"])


# --- helpers -------------------------------------------------------------------------------------


def free(email: str, code: str = "PHP") -> Decimal:
    row = Balance.objects.filter(account__email=email, asset__code=code).first()
    return row.free if row else Decimal(0)


def free_of(account_id: int, code: str = "PHP") -> Decimal:
    row = Balance.objects.filter(account_id=account_id, asset__code=code).first()
    return row.free if row else Decimal(0)


def fees_shard(email: str) -> int:
    """The shard of the fees account that the customer's transfer fees go to."""
    return ledger.shard_account_id(SystemRole.FEES, User.objects.get(email=email).pk)


def snapshot():
    """Everything a transfer could change."""
    return (
        sorted(Balance.objects.values_list("account_id", "asset__code", "free", "locked")),
        Transfer.objects.count(),
        Posting.objects.count(),
    )


def create(client, path=V4, **params):
    response = client.post(path, {**BASE, **params})
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    return response.json()["transfer"]


def refused(client, path, params, code, status, **kwargs) -> dict:
    """The refusal (JSON envelope, code, HTTP status), and nothing moved."""
    before = snapshot()
    response = client.post(path, params, **kwargs)
    assert response["Content-Type"] == "application/json", response.content
    body = assert_error(response, code, status)
    assert snapshot() == before
    return body


def query(client, path=V3, **params):
    params.setdefault("recvWindow", 5000)
    response = client.get(path, params)
    assert response.status_code == 200, response.content
    return response.json()


def assert_record(record: dict) -> None:
    assert RECORD_FIELDS <= set(record) <= RECORD_FIELDS | OPTIONAL_RECORD_FIELDS, record
    for name in RECORD_FIELDS - {"type"}:
        assert isinstance(record[name], str), (name, record)
    assert type(record["type"]) is int
    assert record["type"] in (1, 2)


# --- 1. creation: rules and refusals -----------------------------------------------------------------


@pytest.mark.django_db
def test_created_transfer_has_every_field(master_client, world, create_path):
    before_master, before_peer = free(MASTER), free(PEER)
    transfer = create(master_client, create_path, amount="150.5", client_transfer_id="lunch-1", message="lunch on me")
    assert set(transfer) == CREATED_FIELDS
    created = Transfer.objects.get()
    assert transfer == {
        "id": str(created.pk),
        "status": "success",
        "account": "PHP",
        "target_address": PEER,
        "amount": "150.50",
        "fee_amount": "0.00",
        "exchange": None,
        "payment": str(created.posting_id),
        "client_transfer_id": "lunch-1",
        "message": "lunch on me",
        "errorMessage": None,
    }
    assert created.api_version == create_path.split("/")[3]
    assert free(MASTER) == before_master - Decimal("150.5")
    assert free(PEER) == before_peer + Decimal("150.5")
    assert ledger_check().ok


@pytest.mark.django_db
def test_text_with_sql_and_array_syntax_is_stored_exactly(master_client, world, create_path):
    """The transfer row is written by the posting's statement (LinkedRow): text arrives as bound
    parameters, so quotes, braces, commas and backslashes are data, stored and answered as sent."""
    message = 'a,"b"{c}\\d\'); DROP TABLE wallet_transfer; -- é中'
    client_id = '{x,"y"}'
    transfer = create(master_client, create_path, client_transfer_id=client_id, message=message)
    assert (transfer["message"], transfer["client_transfer_id"]) == (message, client_id)
    stored = Transfer.objects.get()
    assert (stored.message, stored.client_transfer_id, stored.target_address) == (message, client_id, PEER)
    assert ledger_check().ok


@pytest.mark.django_db
def test_optional_fields_absent(master_client, world, create_path):
    transfer = create(master_client, create_path)
    assert transfer["client_transfer_id"] == ""
    assert transfer["message"] == ""
    assert transfer["amount"] == "10.00"


@pytest.mark.django_db
@pytest.mark.parametrize("address", [PEER, "PEER@Demo.Exchange", " peer@demo.exchange", PEER_PHONE])
def test_recipient_by_email_any_case_or_phone(master_client, world, create_path, address):
    before = free(PEER)
    transfer = create(master_client, create_path, target_address=address, amount="3")
    assert transfer["target_address"] == address  # as the sender wrote it
    assert free(PEER) == before + 3
    assert Transfer.objects.get().recipient.email == PEER


@pytest.mark.django_db
@pytest.mark.parametrize("decoded_signature", [False, True], ids=["signed-as-sent", "signed-decoded"])
def test_email_percent_encoded_in_form_body(world, create_path, decoded_signature):
    """A form body carries the e-mail as peer%40demo.exchange; official clients sign the decoded text."""
    api_key, secret = world["master"]["api_key"], world["master"]["secret_key"]
    body = urlencode({"account": "PHP", "target_address": PEER, "amount": "7", "timestamp": now_ms()})
    assert "peer%40demo.exchange" in body
    signed_text = body.replace("%40", "@") if decoded_signature else body
    signature = hmac.new(secret.encode(), signed_text.encode(), hashlib.sha256).hexdigest()
    before = free(PEER)
    response = Client().post(
        create_path,
        data=f"{body}&signature={signature}",
        content_type="application/x-www-form-urlencoded",
        headers={"X-SERVICE-APIKEY": api_key},
    )
    assert response.status_code == 200, response.content
    assert response.json()["transfer"]["target_address"] == PEER
    assert free(PEER) == before + 7


@pytest.mark.django_db
def test_phone_in_form_body(master_client, world, create_path):
    before = free(PEER)
    response = master_client.post(create_path, body={"account": "PHP", "target_address": PEER_PHONE, "amount": "2"})
    assert response.status_code == 200, response.content
    assert free(PEER) == before + 2


@pytest.mark.django_db
def test_sub_account_can_receive_and_send(master_client, sub_client, world, create_path):
    before = free(SUB)
    create(master_client, create_path, target_address=SUB, amount="5")
    create(sub_client, create_path, target_address=PEER, amount="4")
    assert free(SUB) == before + 1


REFUSALS = [
    ("unknown-email", {"target_address": "nobody@demo.exchange"}, -1151, 404),
    ("unknown-phone", {"target_address": "+639179999999"}, -1151, 404),
    ("system-account", {"target_address": "system+equity@ledger.internal"}, -1151, 404),
    ("self-by-email", {"target_address": MASTER}, -1025, 400),
    ("self-by-email-other-case", {"target_address": "MASTER@demo.exchange"}, -1025, 400),
    ("self-by-phone", {"target_address": MASTER_PHONE}, -1025, 400),
    ("unknown-account", {"account": "DOGE"}, -1025, 400),
    ("beyond-precision-php", {"amount": "1.001"}, -1025, 400),
    ("beyond-precision-btc", {"account": "BTC", "amount": "0.000010001"}, -1025, 400),
    ("beyond-precision-usdt", {"account": "USDT", "amount": "1.0000001"}, -1025, 400),
    ("below-minimum-php", {"amount": "0.99"}, -1025, 400),
    ("below-minimum-btc", {"account": "BTC", "amount": "0.000009"}, -1025, 400),
    ("zero", {"amount": "0"}, -1025, 400),
    ("zero-with-decimals", {"amount": "0.00"}, -1025, 400),
    ("negative", {"amount": "-1"}, -1025, 400),
    ("exponent", {"amount": "1e3"}, -1025, 400),
    ("exponent-upper", {"amount": "1E3"}, -1025, 400),
    ("not-a-number", {"amount": "ten"}, -1025, 400),
    ("recvWindow-above-60000", {"recvWindow": "60001"}, -1025, 400),
    ("recvWindow-zero", {"recvWindow": "0"}, -1025, 400),
    ("client_transfer_id-101-chars", {"client_transfer_id": "x" * 101}, -1025, 400),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "code", "status"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals(master_client, world, create_path, change, code, status):
    refused(master_client, create_path, {**BASE, **change}, code, status)
    assert ledger_check().ok


@pytest.mark.django_db
@pytest.mark.parametrize("missing", ["account", "target_address", "amount"])
def test_missing_parameter(master_client, world, create_path, missing):
    params = {k: v for k, v in BASE.items() if k != missing}
    body = refused(master_client, create_path, params, -1105, 400)
    assert missing in body["msg"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [
        {"amount": "1"},
        {"amount": "1.00"},
        {"amount": "0.01", "account": "USDT"},
        {"amount": "0.00001", "account": "BTC"},
        {"amount": "0.01234567", "account": "BTC"},
        {"recvWindow": "60000"},
        {"client_transfer_id": "x" * 100},
    ],
    ids=["php-minimum", "trailing-zeros", "usdt-minimum", "btc-minimum", "btc-8-places", "recvWindow-60000", "id-100"],
)
def test_accepted_edges(master_client, world, create_path, change):
    create(master_client, create_path, **change)


@pytest.mark.django_db
def test_repeat_client_transfer_id_moves_nothing(master_client, peer_client, world, create_path):
    first = create(master_client, create_path, client_transfer_id="once", amount="10")
    for other_path in (V4, V3):  # v4 and v3 share the per-sender id space
        for change in ({}, {"amount": "20"}, {"target_address": SUB}):
            body = refused(master_client, other_path, {**BASE, "client_transfer_id": "once", **change}, -1010, 400)
            assert "client_transfer_id" in body["msg"]
    assert Transfer.objects.filter(client_transfer_id="once").count() == 1
    # Unique per sender: another sender may use the same id.
    second = create(peer_client, create_path, target_address=MASTER, client_transfer_id="once", amount="1")
    assert second["id"] != first["id"]
    assert ledger_check().ok


@pytest.mark.django_db
def test_insufficient_balance(peer_client, world, create_path):
    assert free(PEER) == Decimal(5000)
    refused(peer_client, create_path, {**BASE, "target_address": MASTER, "amount": "5000.01"}, -1131, 400)
    usdt = {**BASE, "target_address": MASTER, "account": "USDT", "amount": "500.01"}
    refused(peer_client, create_path, usdt, -1131, 400)
    create(peer_client, create_path, target_address=MASTER, amount="5000")
    assert free(PEER) == 0
    refused(peer_client, create_path, {**BASE, "target_address": MASTER, "amount": "1"}, -1131, 400)
    assert ledger_check().ok


@pytest.mark.django_db
def test_amount_too_large_for_the_ledger_is_refused_cleanly(master_client, world, create_path):
    """An amount the regex admits (up to 30 integer digits) but nobody holds: a 4xx refusal, never a
    500. Without limit tiers, nothing stops such an amount before the ledger."""
    from exchange.runtime.ttlcache import clear_all

    User.objects.update(limit_tier=None)
    LimitTier.objects.all().delete()
    clear_all()
    Asset.objects.create(
        code="FREE", name="No limits", transfer_precision=2, transfer_min_quantity=1, reference_price=1
    )
    for amount in ("100000000000", "1" * 30):
        response = master_client.post(create_path, {**BASE, "account": "FREE", "amount": amount})
        assert response.status_code in (400, 404), (amount, response.status_code, response.content)
        assert response.json()["code"] in (-1131, -1025), response.content
    assert Transfer.objects.count() == 0


@pytest.mark.django_db
def test_fee_from_transfer_fee(master_client, peer_client, world, create_path):
    TransferFee.objects.create(asset=Asset.objects.get(code="PHP"), fee=Decimal("2.5"))
    fees = fees_shard(MASTER)
    master_before, peer_before, fees_before = free(MASTER), free(PEER), free_of(fees)
    transfer = create(master_client, create_path, amount="100")
    assert transfer["amount"] == "100.00"
    assert transfer["fee_amount"] == "2.50"
    assert free(MASTER) == master_before - Decimal("102.5")
    assert free(PEER) == peer_before + 100
    assert free_of(fees) == fees_before + Decimal("2.5")
    assert Transfer.objects.get().fee == Decimal("2.5")
    record = query(master_client, f"{V3}/{transfer['id']}")["transfer"]
    assert (record["amount"], record["fee_amount"]) == ("100.00", "2.50")
    # The sender must hold amount + fee; other assets have no fee.
    peer_total = free(PEER)
    refused(peer_client, create_path, {**BASE, "target_address": MASTER, "amount": str(peer_total)}, -1131, 400)
    create(peer_client, create_path, target_address=MASTER, amount=str(peer_total - Decimal("2.5")))
    assert free(PEER) == 0
    assert create(master_client, create_path, account="BTC", amount="0.01")["fee_amount"] == "0.00000000"
    assert ledger_check().ok


def _tier(name: str, period: str, cash_out: str) -> LimitTier:
    tier = LimitTier.objects.create(name=name, currency="PHP")
    big = Decimal(10**9)
    TierLimit.objects.create(
        tier=tier, period=period, cash_in_limit=big, cash_out_limit=Decimal(cash_out), total_withdraw_limit=big
    )
    return tier


def _assign(email: str, tier: LimitTier) -> None:
    user = User.objects.get(email=email)
    user.limit_tier = tier
    user.save()  # through save(): the gateway's keyring cache is evicted


@pytest.mark.django_db
@pytest.mark.parametrize("period", [LimitPeriod.DAILY, LimitPeriod.P2P_DAILY])
def test_daily_cash_out_limit(master_client, world, create_path, period):
    _assign(MASTER, _tier("tiny", period, "100"))
    create(master_client, create_path, amount="60")
    body = refused(master_client, create_path, {**BASE, "amount": "50"}, -1010, 400)
    assert "limit" in body["msg"]
    create(master_client, create_path, amount="40")  # exactly the limit
    refused(master_client, create_path, {**BASE, "amount": "1"}, -1010, 400)
    # Other assets count at their reference price (BTC 5,000,000 PHP).
    refused(master_client, create_path, {**BASE, "account": "BTC", "amount": "0.00001"}, -1010, 400)
    # The recipient's cash-out is not touched by what it received.
    assert ledger_check().ok


@pytest.mark.django_db
def test_limit_counts_the_fee(master_client, world, create_path):
    _assign(MASTER, _tier("tiny", LimitPeriod.DAILY, "100"))
    TransferFee.objects.create(asset=Asset.objects.get(code="PHP"), fee=Decimal("5"))
    refused(master_client, create_path, {**BASE, "amount": "96"}, -1010, 400)
    create(master_client, create_path, amount="95")


@pytest.mark.django_db
def test_limit_checked_on_a_stale_snapshot_is_checked_again_under_the_lock(master_client, world, monkeypatch):
    """The limit check runs on the counters read with the recipient (before the transaction) and is
    skipped under the lock only while the sender's ledger seq is the one read with them. Here the
    snapshot is made stale (empty counters, an older seq): the check under the lock still refuses."""
    from accounts import limits, selectors

    _assign(MASTER, _tier("tiny", LimitPeriod.DAILY, "100"))
    create(master_client, V4, amount="60")
    real = selectors.snapshot_from_rows
    made = []

    def stale(rows):
        made.append(real(rows))
        return limits.LimitSnapshot(made[-1].seq - 1, ())  # "nothing used yet", as of an earlier seq

    monkeypatch.setattr(selectors, "snapshot_from_rows", stale)  # the snapshot read with the recipient
    refused(master_client, V4, {**BASE, "amount": "50"}, -1010, 400)
    assert len(made) == 1
    assert Transfer.objects.count() == 1
    assert ledger_check().ok


@pytest.mark.django_db
def test_limit_is_checked_once_when_nothing_moved_on_the_sender(master_client, world, monkeypatch):
    from accounts import limits

    _assign(MASTER, _tier("tiny", LimitPeriod.DAILY, "100"))
    calls = []
    real = limits.outflow_refusal
    monkeypatch.setattr(limits, "outflow_refusal", lambda *a, **k: calls.append(k.get("snap")) or real(*a, **k))
    create(master_client, V4, amount="60")
    assert len(calls) == 1
    assert calls[0] is not None  # on the snapshot, not under the lock
    refused(master_client, V4, {**BASE, "amount": "50"}, -1010, 400)
    # Refused on the snapshot, then decided under the lock (a refusal is final only there).
    assert len(calls) == 3
    assert calls[1] is not None
    assert calls[2] is None


@pytest.mark.django_db
def test_read_only_key_is_refused(world, create_path):
    readonly = SignedClient(world["readonly"]["api_key"], world["readonly"]["secret_key"])
    refused(readonly, create_path, BASE, -1020, 401)


@pytest.mark.django_db
def test_bad_signature_and_stale_timestamp_are_json(master_client, world, create_path):
    refused(master_client, create_path, BASE, -1022, 401, signature="0" * 64)
    refused(master_client, create_path, BASE, -1021, 400, timestamp=now_ms() - 10_000)
    refused(master_client, create_path, BASE, -2018, 401, api_key="NoSuchKey")


@pytest.mark.django_db
def test_rate_limit_weight_50(master_client, world, settings, create_path):
    """The spec's limits: 120/min per IP, 180/min per UID; a transfer weighs 50, so the third in a
    minute is refused with 429 (-1003) and a Retry-After header, and moves nothing."""
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 120
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 180
    first = master_client.post(create_path, BASE)
    assert first.status_code == 200
    assert first["X-SERVICE-USED-WEIGHT-1M"] == "50"
    assert first["X-SERVICE-USED-UID-WEIGHT-1M"] == "50"
    assert master_client.post(create_path, BASE).status_code == 200
    third = master_client.post(create_path, BASE)
    assert_error(third, -1003, 429)
    assert int(third["Retry-After"]) >= 1
    assert Transfer.objects.count() == 2


@pytest.mark.django_db
def test_uid_limit_applies_across_ips(master_client, world, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 120
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 180
    for ip in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert master_client.post(V4, BASE, ip=ip).status_code == 200
    assert_error(master_client.post(V4, BASE, ip="10.0.0.4"), -1003, 429)
    assert Transfer.objects.count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", V4, 405),
        ("PUT", V4, 405),
        ("DELETE", V4, 405),
        ("PATCH", V4, 405),
        ("GET", V4 + "/123", 404),
        ("POST", V4 + "/123", 404),
        ("POST", "/openapi/transfer/v4/transfer", 404),
        ("POST", "/openapi/transfer/v4/", 404),
        ("DELETE", V3, 405),
        ("POST", V3 + "/123", 405),
    ],
)
def test_v4_answers_json_for_404_and_405(master_client, world, method, path, status):
    response = master_client.request(method, path, BASE)
    assert response["Content-Type"] == "application/json", response.content
    assert_error(response, -1010, status)
    assert Transfer.objects.count() == 0


@pytest.mark.django_db
def test_v4_answers_json_for_an_unexpected_failure(master_client, world, monkeypatch):
    from wallet.transfers import services

    def explode(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(services, "transfer_create", explode)
    response = master_client.post(V4, BASE)
    assert response["Content-Type"] == "application/json"
    assert_error(response, -1000, 500)


# --- 2. queries ----------------------------------------------------------------------------------


@pytest.fixture
def history(master_client, peer_client, world):
    """master -> peer (2), peer -> master (1), master -> sub (1), sub -> peer (1): ids in order."""
    sub = SignedClient(world["sub"]["api_key"], world["sub"]["secret_key"])
    return [
        create(master_client, V4, amount="10", client_transfer_id="m1", message="first"),
        create(master_client, V3, amount="11", client_transfer_id="m2"),
        create(peer_client, V4, target_address=MASTER, amount="12", client_transfer_id="p1"),
        create(master_client, V4, target_address=SUB, amount="13", client_transfer_id="m3"),
        create(sub, V4, target_address=PEER, amount="14", client_transfer_id="s1"),
    ]


@pytest.mark.django_db
def test_get_by_id_has_every_record_field(master_client, peer_client, history):
    sent = history[0]
    got = query(master_client, f"{V3}/{sent['id']}")
    assert set(got) == {"transfer"}
    record = got["transfer"]
    assert_record(record)
    transfer = Transfer.objects.get(pk=int(sent["id"]))
    expected = {
        "id": sent["id"],
        "client_transfer_id": "m1",
        "account": "PHP",
        "amount": "10.00",
        "fee_amount": "0.00",
        "currency": "PHP",
        "payment": sent["payment"],
        "status": "success",
        "message": "first",
        "target_address": PEER,
        "sourceAddress": MASTER,
        "source_address": MASTER,
        "type": 2,
    }
    assert {k: record[k] for k in expected} == expected
    created = datetime.fromisoformat(record["created_at"])
    assert created.tzinfo is not None
    assert abs(created - transfer.created_at) < timedelta(milliseconds=1)
    assert abs(datetime.now(UTC) - created) < timedelta(minutes=5)
    # The recipient sees the same transfer as incoming.
    seen_by_peer = query(peer_client, f"{V3}/{sent['id']}")["transfer"]
    assert seen_by_peer["type"] == 1
    assert {k: v for k, v in seen_by_peer.items() if k != "type"} == {k: v for k, v in record.items() if k != "type"}


@pytest.mark.django_db
def test_id_in_the_query_string(master_client, history):
    got = query(master_client, V3, id=history[1]["id"])
    assert got["transfer"]["client_transfer_id"] == "m2"


@pytest.mark.django_db
def test_id_wins_over_client_transfer_id(master_client, history):
    got = query(master_client, V3, id=history[0]["id"], client_transfer_id="m2")
    assert got["transfer"]["id"] == history[0]["id"]
    got = query(master_client, f"{V3}/{history[3]['id']}", client_transfer_id="m1")
    assert got["transfer"]["id"] == history[3]["id"]


@pytest.mark.django_db
def test_client_transfer_id_selects(master_client, history):
    got = query(master_client, V3, client_transfer_id="m2")
    items = got.get("transfers") or [got.get("transfer")]
    assert [t["id"] for t in items] == [history[1]["id"]]


@pytest.mark.django_db
def test_list_form(master_client, peer_client, history):
    listed = query(master_client)
    assert set(listed) == {"transfers", "meta"}
    assert listed["meta"] == {"total_count": 4, "next_page": None, "previous_page": None}
    ids = [t["id"] for t in listed["transfers"]]
    assert ids == [history[i]["id"] for i in (0, 1, 2, 3)]  # oldest first
    assert [t["type"] for t in listed["transfers"]] == [2, 2, 1, 2]
    for record in listed["transfers"]:
        assert_record(record)
    incoming = listed["transfers"][2]
    assert (incoming["sourceAddress"], incoming["source_address"], incoming["target_address"]) == (
        PEER,
        PEER,
        MASTER,
    )
    created = [datetime.fromisoformat(t["created_at"]) for t in listed["transfers"]]
    assert created == sorted(created)
    # The peer's own view: received 2 from master and 1 from sub, sent 1.
    peer_view = query(peer_client)["transfers"]
    assert [(t["id"], t["type"]) for t in peer_view] == [
        (history[0]["id"], 1),
        (history[1]["id"], 1),
        (history[2]["id"], 2),
        (history[4]["id"], 1),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("one", [False, True], ids=["list", "by-id"])
def test_query_recv_window_is_optional(master_client, history, one):
    """The official connector's query_transfer and the Postman request send recvWindow empty or not
    at all: the clients win over the spec's table (docs/api.md)."""
    path = f"{V3}/{history[0]['id']}" if one else V3
    for params in ({}, {"recvWindow": ""}, {"recvWindow": 60000}):
        response = master_client.get(path, params)
        assert response.status_code == 200, (params, response.content)
    for bad in (60001, "abc", 0):
        assert_error(master_client.get(path, {"recvWindow": bad}), -1025, 400)


@pytest.mark.django_db
def test_paging(master_client, history):
    page1 = query(master_client, per_page=3)
    assert [t["id"] for t in page1["transfers"]] == [history[i]["id"] for i in (0, 1, 2)]
    assert page1["meta"] == {"total_count": 4, "next_page": 2, "previous_page": None}
    page2 = query(master_client, per_page=3, page=2)
    assert [t["id"] for t in page2["transfers"]] == [history[3]["id"]]
    assert page2["meta"] == {"total_count": 4, "next_page": None, "previous_page": 1}
    page3 = query(master_client, per_page=3, page=3)
    assert page3["transfers"] == []
    assert query(master_client, per_page=2000)["meta"]["total_count"] == 4
    for bad in ({"per_page": 2001}, {"per_page": 0}, {"page": 0}, {"page": "x"}, {"per_page": "1.5"}):
        assert_error(master_client.get(V3, {"recvWindow": 5000, **bad}), -1025, 400)


@pytest.mark.django_db
def test_per_page_defaults_to_2000(master_client, world):
    """2,001 transfer records (made directly: the query is what is under test)."""
    master = User.objects.get(email=MASTER)
    peer = User.objects.get(email=PEER)
    php = Asset.objects.get(code="PHP")
    now = datetime.now(UTC)
    postings = Posting.objects.bulk_create(
        [Posting(kind=BusinessType.P2P_TRANSFER, reference=f"paging:{i}", created_at=now) for i in range(2001)]
    )
    Transfer.objects.bulk_create(
        [Transfer(sender=master, recipient=peer, asset=php, amount=1, target_address=PEER, posting=p) for p in postings]
    )
    first = query(master_client)
    assert len(first["transfers"]) == 2000
    assert first["meta"] == {"total_count": 2001, "next_page": 2, "previous_page": None}
    second = query(master_client, page=2)
    assert len(second["transfers"]) == 1
    assert second["meta"] == {"total_count": 2001, "next_page": None, "previous_page": 1}


@pytest.mark.django_db
def test_from_and_to_address_not_both(master_client, history):
    assert_error(master_client.get(V3, {"recvWindow": 5000, "from_address": PEER, "to_address": SUB}), -1107, 400)


@pytest.mark.django_db
def test_address_filters(master_client, peer_client, history):
    def ids(client, **filters):
        return [t["id"] for t in query(client, **filters)["transfers"]]

    h = [t["id"] for t in history]
    assert ids(master_client, to_address=PEER) == [h[0], h[1]]
    assert ids(master_client, to_address=SUB) == [h[3]]
    assert ids(master_client, from_address=PEER) == [h[2]]
    assert ids(master_client, from_address=MASTER) == [h[0], h[1], h[3]]
    assert ids(master_client, to_address="Peer@Demo.Exchange") == [h[0], h[1]]
    assert ids(master_client, to_address=PEER_PHONE) == [h[0], h[1]]
    assert ids(peer_client, from_address=SUB) == [h[4]]
    assert ids(peer_client, from_address=MASTER) == [h[0], h[1]]
    assert ids(master_client, to_address="nobody@demo.exchange") == []
    # The e-mail URL-encoded by hand in the query string (signed as sent).
    query_text = f"recvWindow=5000&to_address={quote(PEER, safe='')}&timestamp={now_ms()}"
    assert "%40" in query_text
    signature = hmac.new(master_client.secret.encode(), query_text.encode(), hashlib.sha256).hexdigest()
    response = master_client.client.get(
        f"{V3}?{query_text}&signature={signature}", headers={"X-SERVICE-APIKEY": master_client.api_key}
    )
    assert [t["id"] for t in response.json()["transfers"]] == [h[0], h[1]]


@pytest.mark.django_db
def test_other_accounts_transfers_are_not_visible(master_client, sub_client, history):
    master_to_peer = history[0]["id"]
    assert_error(sub_client.get(f"{V3}/{master_to_peer}", {"recvWindow": 5000}), -1010, 404)
    assert_error(sub_client.get(V3, {"recvWindow": 5000, "id": master_to_peer}), -1010, 404)
    seen = [t["id"] for t in query(sub_client)["transfers"]]
    assert seen == [history[3]["id"], history[4]["id"]]
    assert query(sub_client, client_transfer_id="m1").get("transfers", []) == []


@pytest.mark.django_db
@pytest.mark.parametrize("transfer_id", ["999999999", "abc", "%C2%B2", "99999999999999999999999999"])
def test_unknown_ids_are_404(master_client, history, transfer_id):
    assert_error(master_client.get(f"{V3}/{transfer_id}", {"recvWindow": 5000}), -1010, 404)


# --- 3. effects ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_one_posting_of_kind_p2p_transfer(master_client, world):
    TransferFee.objects.create(asset=Asset.objects.get(code="PHP"), fee=Decimal("1"))
    fees = fees_shard(MASTER)
    postings_before = Posting.objects.count()
    transfer = create(master_client, amount="25", message="rent")
    assert Posting.objects.count() == postings_before + 1
    posting = Posting.objects.get(pk=int(transfer["payment"]))
    assert posting.kind == BusinessType.P2P_TRANSFER
    assert posting.memo == "rent"
    master, peer = User.objects.get(email=MASTER), User.objects.get(email=PEER)
    entries = sorted((e.account_id, e.side * e.amount) for e in Entry.objects.filter(posting=posting))
    assert entries == sorted([(master.pk, Decimal(-26)), (peer.pk, Decimal(25)), (fees, Decimal(1))])
    assert ledger_check().ok


@pytest.mark.django_db
def test_both_transaction_histories_show_it(master_client, peer_client, world):
    TransferFee.objects.create(asset=Asset.objects.get(code="PHP"), fee=Decimal("0.5"))
    transfer = create(master_client, amount="42.25")

    def item(client):
        found = client.get("/openapi/v1/asset/transaction/history", {"tokenId": "PHP"}).json()["transactions"]
        return next(t for t in found if t["txId"] == transfer["payment"])

    sent, received = item(master_client), item(peer_client)
    assert sent["bizSubject"] == received["bizSubject"] == "P2P_TRANSFER"
    assert sent["status"] == received["status"] == "SUCCESS"
    assert sent["changed"] == "-42.75"
    assert received["changed"] == "42.25"
    assert sent["tokenId"] == "PHP"
    assert sent["time"] == received["time"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_both_streams_receive_the_transfer(world):
    master = await sync_to_async(User.objects.get)(email=MASTER)
    peer = await sync_to_async(User.objects.get)(email=PEER)
    master_php, peer_php = await sync_to_async(free)(MASTER), await sync_to_async(free)(PEER)
    streams = []
    for user in (master, peer):
        key = await sync_to_async(stream_services.listen_key_start)(account=user)
        ws = communicator(key)
        connected, _ = await ws.connect()
        assert connected
        streams.append(ws)
    client = SignedClient(world["master"]["api_key"], world["master"]["secret_key"])
    response = await sync_to_async(client.post)(V4, {**BASE, "amount": "12.5"})
    assert response.status_code == 200, response.content
    for ws, delta, after in (
        (streams[0], "-12.50", master_php - Decimal("12.5")),
        (streams[1], "12.50", peer_php + Decimal("12.5")),
    ):
        update = await ws.receive_json_from(timeout=5)
        position = await ws.receive_json_from(timeout=5)
        assert update["e"] == "balanceUpdate"
        assert (update["a"], update["d"], update["BS"]) == ("PHP", delta, "P2P_TRANSFER")
        assert position["e"] == "outboundAccountPosition"
        assert position["B"] == [{"a": "PHP", "f": f"{after:.2f}", "l": "0.00"}]
        assert position["u"] == update["T"]
        if not await ws.receive_nothing(0.2):  # seen once in a whole-suite SQLite run: say what it was
            pytest.fail(f"an unexpected frame after the transfer's: {await ws.receive_output(1)}")
    for ws in streams:
        await ws.disconnect()
    assert (await sync_to_async(ledger_check)()).ok


@pytest.fixture
def admin_client(db):
    user = User.objects.create_superuser(email="ops@test.example", password="ops-password")
    client = Client()
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def second_admin_client(db):
    """Another superuser: a reversal is asked for by one Administrator and confirmed by another
    (tests/wallet/test_transfer_reversal.py tests the rule itself)."""
    user = User.objects.create_superuser(email="ops2@test.example", password="ops-password")
    client = Client()
    client.force_login(user)
    client.user = user
    return client


def _reverse_url(transfer_id) -> str:
    return f"/admin/wallet/transfer/{transfer_id}/reverse/"


def _ask_for_reversal(client, transfer_id, reason: str) -> None:
    asked = client.post(_reverse_url(transfer_id), {"reason": reason}, follow=True)
    assert "Another Administrator must confirm it" in asked.content.decode()
    assert Transfer.objects.get(pk=int(transfer_id)).reversal_requested_by == client.user


@pytest.mark.django_db
def test_admin_reversal_once(master_client, admin_client, second_admin_client, world):
    TransferFee.objects.create(asset=Asset.objects.get(code="PHP"), fee=Decimal("2"))
    fees = fees_shard(MASTER)
    before = (free(MASTER), free(PEER), free_of(fees))
    transfer = create(master_client, amount="30")
    assert (free(MASTER), free(PEER), free_of(fees)) == (before[0] - 32, before[1] + 30, before[2] + 2)
    postings = Posting.objects.count()

    form = admin_client.get(_reverse_url(transfer["id"]))
    assert form.status_code == 200
    no_reason = admin_client.post(_reverse_url(transfer["id"]), {"reason": ""})
    assert no_reason.status_code == 200  # the form again
    assert Posting.objects.count() == postings

    _ask_for_reversal(admin_client, transfer["id"], "sent to the wrong person")
    assert Posting.objects.count() == postings
    done = second_admin_client.post(_reverse_url(transfer["id"]), {"reason": "ticket checked"}, follow=True)
    assert done.status_code == 200
    assert "reversed by a new posting" in done.content.decode()
    assert Posting.objects.count() == postings + 1
    row = Transfer.objects.get(pk=int(transfer["id"]))
    assert row.reversal_requested_by == admin_client.user
    assert row.reversed_by == second_admin_client.user
    assert row.reversal_reason == "sent to the wrong person"
    reversal = row.reversal_posting
    assert reversal.pk != row.posting_id
    assert reversal.kind == BusinessType.OTHERS  # a correction, not a transfer either customer made
    assert "sent to the wrong person" in reversal.memo
    assert "ticket checked" in reversal.memo
    assert reversal.actor_id == second_admin_client.user.pk
    assert (free(MASTER), free(PEER), free_of(fees)) == before
    # The original posting stays in the journal.
    assert Posting.objects.filter(pk=row.posting_id).exists()

    again = admin_client.post(_reverse_url(transfer["id"]), {"reason": "again"}, follow=True)
    assert "already reversed" in again.content.decode()
    assert Posting.objects.count() == postings + 1
    assert (free(MASTER), free(PEER), free_of(fees)) == before
    assert ledger_check().ok


@pytest.mark.django_db
def test_admin_reversal_refused_when_the_recipient_spent_it(
    master_client, peer_client, admin_client, second_admin_client, world
):
    transfer = create(master_client, target_address=SUB, amount="10000")  # the sub held 10,000 PHP
    sub = SignedClient(world["sub"]["api_key"], world["sub"]["secret_key"])
    create(sub, target_address=PEER, amount=str(free(SUB)))
    state = snapshot()
    _ask_for_reversal(admin_client, transfer["id"], "mistake")
    refused_page = second_admin_client.post(_reverse_url(transfer["id"]), {"reason": "confirmed"}, follow=True)
    assert "no longer holds" in refused_page.content.decode()
    assert snapshot() == state
    row = Transfer.objects.get(pk=int(transfer["id"]))
    assert row.reversal_posting_id is None
    assert row.reversal_requested_by == admin_client.user  # the request stays open
    assert ledger_check().ok


@pytest.mark.django_db
def test_admin_list_filters_and_read_only(master_client, admin_client, world):
    transfer = create(master_client, client_transfer_id="find-me")
    php = Asset.objects.get(code="PHP")
    listing = admin_client.get("/admin/wallet/transfer/", {"asset__id__exact": php.pk, "q": "find-me"})
    assert listing.status_code == 200
    assert "find-me" in listing.content.decode()
    assert admin_client.get("/admin/wallet/transfer/add/").status_code == 403
    assert admin_client.get(f"/admin/wallet/transfer/{transfer['id']}/delete/").status_code == 403
    assert admin_client.get(f"/admin/wallet/transfer/{transfer['id']}/change/").status_code == 200


@pytest.mark.django_db
def test_admin_reversal_needs_change_permission(master_client, world):
    transfer = create(master_client)
    anonymous = Client().post(_reverse_url(transfer["id"]), {"reason": "x"})
    assert anonymous.status_code == 302
    assert "/login/" in anonymous["Location"]
    viewer = User.objects.create_user(email="viewer@test.example", password="pw", is_staff=True)
    client = Client()
    client.force_login(viewer)
    assert client.post(_reverse_url(transfer["id"]), {"reason": "x"}).status_code == 403
    assert Transfer.objects.get(pk=int(transfer["id"])).reversal_posting_id is None


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="moves a PostgreSQL sequence")
def test_client_transfer_id_reversal_does_not_collide_with_an_admin_reversal(
    master_client, admin_client, second_admin_client, world
):
    """Posting references share one namespace: a transfer's is `transfer:<sender id>:<client id>`, a
    reversal's `transfer:<transfer id>:reversal`. A sender whose id equals a reversed transfer's id
    must still be able to use the client_transfer_id "reversal" (and the reversal must work the
    other way round)."""
    from django.db import connection

    from accounts import services as account_services

    # Make the next user id and the next transfer id the same number.
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence('accounts_user', 'id'))")
        next_user = cursor.fetchone()[0]
        cursor.execute("SELECT nextval(pg_get_serial_sequence('wallet_transfer', 'id'))")
        next_transfer = cursor.fetchone()[0]
        target = max(next_user, next_transfer) + 1
        cursor.execute("SELECT setval(pg_get_serial_sequence('accounts_user', 'id'), %s, false)", [target])
        cursor.execute("SELECT setval(pg_get_serial_sequence('wallet_transfer', 'id'), %s, false)", [target])
    sender = account_services.user_create(email="same-number@test.example", password="pw")
    assert sender.pk == target
    created = account_services.api_key_create(user=sender, name="t")
    sender_client = SignedClient(created.api_key.key, created.secret)
    transfer = create(master_client, amount="20")
    assert int(transfer["id"]) == target
    _ask_for_reversal(admin_client, transfer["id"], "collision check")
    second_admin_client.post(_reverse_url(transfer["id"]), {"reason": "confirmed"})
    assert Transfer.objects.get(pk=target).reversal_posting_id is not None
    create(master_client, target_address="same-number@test.example", amount="5")
    response = sender_client.post(V4, {**BASE, "client_transfer_id": "reversal", "amount": "1"})
    assert response.status_code == 200, response.content
