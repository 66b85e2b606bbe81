"""Deposits: addresses, the `deposit` command and the chain scan through the same path, PROCESSING
until minConfirm then credited exactly once, FAILED when the chain says so, NEED_FILL_DATA above
the travel-rule threshold until operators fill the data in."""

from __future__ import annotations

import contextlib
import re
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts import ledger
from accounts.ledger.check import ledger_check
from accounts.models import Balance, BalanceChange, Posting, SystemRole, User
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.factories import Customer, NetworkFactory, customer, demo_networks
from wallet import deposits as wallet_deposits
from wallet.chain.simulator import advance_blocks, send_to
from wallet.models import Deposit, DepositAddress, DepositStatus, Network

pytestmark = pytest.mark.django_db

MASTER = "master@demo.exchange"
ADDRESS = "/openapi/wallet/v1/deposit/address"
HISTORY = "/openapi/wallet/v1/deposit/history"


@pytest.fixture(autouse=True)
def _no_travel_rule(db, settings):
    """Travel rule off unless a test sets a threshold; rate limits out of the way; the demo world's
    networks."""
    settings.TRAVEL_RULE_THRESHOLD = Decimal(0)
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = 10**6
    settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10**6
    demo_networks()


@pytest.fixture(autouse=True)
def owner(_no_travel_rule) -> Customer:
    """The customer the `deposit` command names in these tests (the demo master's e-mail)."""
    return customer(email=MASTER)


@pytest.fixture
def demo_master(owner) -> User:
    return owner.user


@pytest.fixture
def master_client(owner) -> SignedClient:
    return owner.client


@pytest.fixture
def peer() -> Customer:
    return customer()


@pytest.fixture
def operator(db) -> User:
    return User.objects.create_superuser(email="ops@deposits.example", password="pw-for-tests")


def _free(user: User, code: str) -> Decimal:
    row = Balance.objects.filter(account=user, asset__code=code).first()
    return row.free if row else Decimal(0)


def _deposit_cmd(*args: str) -> str:
    out = StringIO()
    call_command("deposit", *args, stdout=out)
    return out.getvalue()


def _credits(deposit: Deposit) -> int:
    return Posting.objects.filter(reference=f"deposit:{deposit.pk}").count()


# --- deposit addresses -------------------------------------------------------------------------


@pytest.mark.parametrize(("coin", "network"), [("BTC", "BTC"), ("ETH", "ETH"), ("USDT", "ETH"), ("USDT", "TRX")])
def test_address_stable_and_matches_the_regex(master_client, coin, network):
    first = master_client.get(ADDRESS, {"coin": coin, "network": network})
    assert first.status_code == 200, first.content
    body = first.json()
    assert set(body) == {"address", "addressTag", "coin"}
    assert body["coin"] == coin
    assert body["addressTag"] == ""
    assert re.fullmatch(NetworkFactory(coin__code=coin, network=network).address_regex, body["address"])
    for _ in range(2):
        assert master_client.get(ADDRESS, {"coin": coin, "network": network}).json() == body
    assert (
        DepositAddress.objects.filter(
            account__email=MASTER, network=NetworkFactory(coin__code=coin, network=network)
        ).count()
        == 1
    )


def test_address_per_network(master_client):
    on_eth = master_client.get(ADDRESS, {"coin": "USDT", "network": "ETH"}).json()["address"]
    on_trx = master_client.get(ADDRESS, {"coin": "USDT", "network": "TRX"}).json()["address"]
    assert on_eth != on_trx


def test_addresses_differ_between_accounts(master_client, owner, peer):
    sub = customer(master=owner.user).client
    peer = peer.client
    addresses = {
        c.get(ADDRESS, {"coin": "USDT", "network": "TRX"}).json()["address"] for c in (master_client, peer, sub)
    }
    assert len(addresses) == 3


def test_address_with_memo(master_client):
    """A network with a memoRegex gives a tag that matches it."""
    Network.objects.filter(coin__code="USDT", network="TRX").update(memo_regex=r"^[0-9]{6,12}$")
    body = master_client.get(ADDRESS, {"coin": "USDT", "network": "TRX"}).json()
    assert re.fullmatch(r"^[0-9]{6,12}$", body["addressTag"])


def test_address_refused_for_a_disabled_network(master_client):
    Network.objects.filter(coin__code="USDT", network="TRX").update(deposit_enable=False)
    assert_error(master_client.get(ADDRESS, {"coin": "USDT", "network": "TRX"}), -1010, 400)
    assert not DepositAddress.objects.exists()
    assert master_client.get(ADDRESS, {"coin": "USDT", "network": "ETH"}).status_code == 200


def test_address_refused_for_a_disabled_network_even_when_issued_before(master_client):
    first = master_client.get(ADDRESS, {"coin": "USDT", "network": "TRX"})
    assert first.status_code == 200
    Network.objects.filter(coin__code="USDT", network="TRX").update(deposit_enable=False)
    assert_error(master_client.get(ADDRESS, {"coin": "USDT", "network": "TRX"}), -1010, 400)


@pytest.mark.parametrize(("coin", "network"), [("DOGE", "DOGE"), ("PHP", "TRX"), ("USDT", "BSC"), ("BTC", "ETH")])
def test_address_refused_for_unknown_coin_or_network(master_client, coin, network):
    assert_error(master_client.get(ADDRESS, {"coin": coin, "network": network}), -1025, 400)
    assert not DepositAddress.objects.exists()


@pytest.mark.parametrize("missing", ["coin", "network"])
def test_address_missing_parameter(master_client, missing):
    params = {"coin": "USDT", "network": "TRX"}
    del params[missing]
    assert_error(master_client.get(ADDRESS, params), -1105, 400)


# --- the deposit command and the scan -----------------------------------------------------------


def test_command_then_confirmations_then_credited_once(demo_master, master_client):
    before = _free(demo_master, "BTC")
    out = _deposit_cmd(MASTER, "BTC", "0.25", "--network", "BTC")
    deposit = Deposit.objects.get()
    assert "processing" in out.lower()
    assert deposit.status == DepositStatus.PROCESSING
    assert deposit.confirmations < NetworkFactory(coin__code="BTC", network="BTC").min_confirm
    assert deposit.account == demo_master
    assert deposit.amount == Decimal("0.25")
    assert _free(demo_master, "BTC") == before
    assert master_client.get(HISTORY).json()[0]["status"] == 0

    wallet_deposits.deposits_scan()  # no new block: still waiting
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.PROCESSING

    advance_blocks(1, network="BTC")  # minConfirm 2
    wallet_deposits.deposits_scan()
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert deposit.confirmations == 2
    assert deposit.credited_at is not None
    assert _free(demo_master, "BTC") == before + Decimal("0.25")

    for _ in range(2):
        advance_blocks(3, network="BTC")
        wallet_deposits.deposits_scan()
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert _credits(deposit) == 1
    assert _free(demo_master, "BTC") == before + Decimal("0.25")
    [record] = master_client.get(HISTORY).json()
    assert record["status"] == 1
    assert record["amount"] == "0.25000000"
    assert ledger_check().ok


def test_credit_event(demo_master):
    world = ledger.shard_account_id(SystemRole.WORLD, demo_master.pk)  # the customer's shard
    _deposit_cmd(MASTER, "USDT", "12.5", "--network", "TRX", "--confirm")
    deposit = Deposit.objects.get()
    assert deposit.status == DepositStatus.SUCCESS
    change = BalanceChange.objects.get(account=demo_master, posting__reference=f"deposit:{deposit.pk}")
    assert change.kind == "CHAIN_DEPOSIT"
    assert (change.delta_free, change.delta_locked) == (Decimal("12.5"), Decimal(0))
    assert change.free_after == _free(demo_master, "USDT")
    assert BalanceChange.objects.get(
        account_id=world, posting__reference=f"deposit:{deposit.pk}"
    ).delta_free == Decimal("-12.5")
    assert ledger_check().ok


def test_command_with_confirm_credits_at_once(demo_master):
    before = _free(demo_master, "ETH")
    out = _deposit_cmd(MASTER, "ETH", "1", "--network", "ETH", "--confirm")
    assert "success" in out.lower()
    assert _free(demo_master, "ETH") == before + 1
    assert ledger_check().ok


@pytest.mark.parametrize(
    "args",
    [
        ("nobody@demo.exchange", "BTC", "1", "--network", "BTC"),
        (MASTER, "BTC", "zero", "--network", "BTC"),
        (MASTER, "BTC", "-1", "--network", "BTC"),
        (MASTER, "BTC", "1", "--network", "TRX"),
        (MASTER, "DOGE", "1", "--network", "DOGE"),
    ],
)
def test_command_refusals(args):
    with pytest.raises(CommandError):
        _deposit_cmd(*args)
    assert not Deposit.objects.exists()
    assert ledger_check().ok


def test_command_twice_with_the_same_tx_id(demo_master):
    """Idempotent per network, tx id and output: the same --tx-id twice is one deposit."""
    before = _free(demo_master, "BTC")
    _deposit_cmd(MASTER, "BTC", "0.1", "--network", "BTC", "--tx-id", "ab" * 32, "--confirm")
    # Refusing the repeat is fine too; crashing on the database or crediting twice is not.
    with contextlib.suppress(CommandError):
        _deposit_cmd(MASTER, "BTC", "0.1", "--network", "BTC", "--tx-id", "ab" * 32, "--confirm")
    assert Deposit.objects.count() == 1
    assert _free(demo_master, "BTC") == before + Decimal("0.1")
    assert ledger_check().ok


def test_same_transaction_recorded_twice(demo_master, master_client):
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    network = address.network
    before = _free(demo_master, "USDT")
    kwargs = {
        "network": network,
        "tx_id": "cd" * 32,
        "output_index": 0,
        "address": address.address,
        "tag": address.tag,
        "amount": Decimal("30"),
    }
    first = wallet_deposits.deposit_record(**kwargs, confirmations=1)
    second = wallet_deposits.deposit_record(**kwargs, confirmations=1)
    assert first.pk == second.pk
    assert Deposit.objects.count() == 1
    assert first.status == DepositStatus.PROCESSING
    wallet_deposits.deposit_record(**kwargs, confirmations=5)
    wallet_deposits.deposit_record(**kwargs, confirmations=6)
    assert Deposit.objects.get().status == DepositStatus.SUCCESS
    assert _credits(first) == 1
    assert _free(demo_master, "USDT") == before + 30
    # Another output of the same transaction is another deposit.
    wallet_deposits.deposit_record(**{**kwargs, "output_index": 1}, confirmations=5)
    assert Deposit.objects.count() == 2
    assert _free(demo_master, "USDT") == before + 60
    assert len(master_client.get(HISTORY, {"txId": "cd" * 32}).json()) == 2
    assert ledger_check().ok


def test_deposit_to_an_unknown_address_is_ignored(demo_master):
    network = NetworkFactory(coin__code="USDT", network="TRX")
    recorded = wallet_deposits.deposit_record(
        network=network,
        tx_id="ef" * 32,
        output_index=0,
        address="TSomebodyE1seAddress11111111111111",
        tag="",
        amount=Decimal(5),
        confirmations=10,
    )
    assert recorded is None
    assert not Deposit.objects.exists()
    assert ledger_check().ok


def test_scan_finds_deposits_sent_on_the_chain(demo_master, peer):
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    peer = peer.user
    peer_address = wallet_deposits.deposit_address_get(account=peer, coin="USDT", network="TRX")
    before, peer_before = _free(demo_master, "USDT"), _free(peer, "USDT")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("7"))
    send_to(network="TRX", address=peer_address.address, tag="", amount=Decimal("8"))
    send_to(network="TRX", address="TNotYoursAddress111111111111111111", tag="", amount=Decimal("9"))
    assert wallet_deposits.deposits_scan() == 2
    assert Deposit.objects.count() == 2
    assert set(Deposit.objects.values_list("status", flat=True)) == {DepositStatus.PROCESSING}
    advance_blocks(2, network="TRX")  # minConfirm 3
    wallet_deposits.deposits_scan()
    wallet_deposits.deposits_scan()
    assert set(Deposit.objects.values_list("status", flat=True)) == {DepositStatus.SUCCESS}
    assert _free(demo_master, "USDT") == before + 7
    assert _free(peer, "USDT") == peer_before + 8
    assert ledger_check().ok


def test_failed_chain_transaction(demo_master, master_client):
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    before = _free(demo_master, "USDT")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("40"), fails=True)
    advance_blocks(5, network="TRX")
    wallet_deposits.deposits_scan()
    wallet_deposits.deposits_scan()
    deposit = Deposit.objects.get()
    assert deposit.status == DepositStatus.FAILED
    assert deposit.credited_at is None
    assert _credits(deposit) == 0
    assert _free(demo_master, "USDT") == before
    assert master_client.get(HISTORY).json()[0]["status"] == 2
    assert master_client.get(HISTORY, {"status": 2}).json()[0]["id"] == str(deposit.pk)
    assert ledger_check().ok


def test_deposit_on_a_network_disabled_meanwhile_is_not_lost(demo_master):
    """A deposit seen before the network's deposits were switched off is credited once they are
    back on (the coins arrived)."""
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("3"))
    wallet_deposits.deposits_scan()
    assert Deposit.objects.get().status == DepositStatus.PROCESSING
    before = _free(demo_master, "USDT")
    Network.objects.filter(coin__code="USDT", network="TRX").update(deposit_enable=False)
    advance_blocks(5, network="TRX")
    wallet_deposits.deposits_scan()
    Network.objects.filter(coin__code="USDT", network="TRX").update(deposit_enable=True)
    wallet_deposits.deposits_scan()
    assert Deposit.objects.get().status == DepositStatus.SUCCESS
    assert _free(demo_master, "USDT") == before + 3
    assert ledger_check().ok


# --- travel rule -------------------------------------------------------------------------------


def test_travel_rule_above_threshold(demo_master, master_client, operator, settings):
    settings.TRAVEL_RULE_THRESHOLD = Decimal("1000")  # PHP; 20 USDT is 1160 PHP
    before = _free(demo_master, "USDT")
    _deposit_cmd(MASTER, "USDT", "20", "--network", "TRX")
    deposit = Deposit.objects.get()
    assert deposit.status == DepositStatus.NEED_FILL_DATA
    assert deposit.travel_rule_required
    advance_blocks(10, network="TRX")
    wallet_deposits.deposits_scan()
    wallet_deposits.deposits_scan()
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.NEED_FILL_DATA
    assert deposit.confirmations >= 3
    assert _free(demo_master, "USDT") == before
    assert master_client.get(HISTORY).json()[0]["status"] == 3
    assert master_client.get(HISTORY, {"statuses": "3"}).json()[0]["id"] == str(deposit.pk)

    with pytest.raises(ValueError, match="empty"):
        wallet_deposits.deposit_fill_travel_rule(
            deposit=deposit, data={}, filled_by=operator, reason="from the sender's VASP"
        )
    filled = wallet_deposits.deposit_fill_travel_rule(
        deposit=deposit, data={"originator_name": "Juan dela Cruz"}, filled_by=operator, reason="from the sender's VASP"
    )
    assert filled.status == DepositStatus.SUCCESS
    assert filled.travel_rule_data["originator_name"] == "Juan dela Cruz"
    assert filled.travel_rule_data["filled_by"] == operator.email
    assert _free(demo_master, "USDT") == before + 20
    assert _credits(deposit) == 1
    with pytest.raises(ValueError, match="does not wait"):
        wallet_deposits.deposit_fill_travel_rule(
            deposit=filled, data={"originator_name": "again"}, filled_by=operator, reason="from the sender's VASP"
        )
    wallet_deposits.deposits_scan()
    assert _credits(deposit) == 1
    assert ledger_check().ok


def test_travel_rule_filled_before_confirmations(demo_master, operator, settings):
    settings.TRAVEL_RULE_THRESHOLD = Decimal("1000")
    before = _free(demo_master, "USDT")
    _deposit_cmd(MASTER, "USDT", "20", "--network", "TRX")
    deposit = wallet_deposits.deposit_fill_travel_rule(
        deposit=Deposit.objects.get(),
        data={"originator_name": "A"},
        filled_by=operator,
        reason="from the sender's VASP",
    )
    assert deposit.status == DepositStatus.PROCESSING  # still waiting for minConfirm
    assert _free(demo_master, "USDT") == before
    advance_blocks(2, network="TRX")
    wallet_deposits.deposits_scan()
    deposit.refresh_from_db()
    assert deposit.status == DepositStatus.SUCCESS
    assert _free(demo_master, "USDT") == before + 20
    assert ledger_check().ok


def test_below_travel_rule_threshold(demo_master, settings):
    settings.TRAVEL_RULE_THRESHOLD = Decimal("1000")  # 17 USDT is 986 PHP
    _deposit_cmd(MASTER, "USDT", "17", "--network", "TRX", "--confirm")
    deposit = Deposit.objects.get()
    assert not deposit.travel_rule_required
    assert deposit.status == DepositStatus.SUCCESS
    assert ledger_check().ok


def test_failed_transaction_waiting_for_travel_rule(demo_master, settings):
    settings.TRAVEL_RULE_THRESHOLD = Decimal("1000")
    address = wallet_deposits.deposit_address_get(account=demo_master, coin="USDT", network="TRX")
    before = _free(demo_master, "USDT")
    send_to(network="TRX", address=address.address, tag=address.tag, amount=Decimal("50"), fails=True)
    advance_blocks(3, network="TRX")
    wallet_deposits.deposits_scan()
    assert Deposit.objects.get().status == DepositStatus.FAILED
    assert _free(demo_master, "USDT") == before
    assert ledger_check().ok
