"""Who a transfer (v4 and legacy v3) can reach, and what a refusal tells about an address (issue 25,
findings 4 and 7).

Finding 7: a transfer looked up the recipient before checking the amount, so `amount=0` answered
-1025 "must be positive" for a registered address and -1151 for an unknown one. Every parameter,
and every refusal that depends on the sender alone (its limit, its balance), now comes first or is
given for an unknown address too: the answer is the same for both.

Finding 4: a virtual sub-account is reached only from inside its family; from anyone else it is
refused exactly as an address nobody has."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.models import LimitTier, TierLimit, User
from exchange.runtime.ttlcache import clear_all
from tests.support.assertions import assert_balance, assert_error, assert_ledger_balanced
from tests.support.factories import AssetFactory, customer
from wallet.models import Transfer

V4 = "/openapi/transfer/v4/transfers"
V3 = "/openapi/transfer/v3/transfers"
UNKNOWN = "nobody-at-all@test.example"


@pytest.fixture(params=[V4, V3], ids=["v4", "v3"])
def create_path(request):
    return request.param


@pytest.fixture(autouse=True)
def _roomy_rate_limits(settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 1_000_000


@pytest.fixture
def php(db):
    clear_all()  # the transfer services' asset and fee caches
    return AssetFactory(code="PHP")  # the demo's PHP: 2 decimal places, minimum 1


@pytest.fixture
def sender(php):
    return customer(funding={"PHP": "100"})


@pytest.fixture
def registered(php):
    return customer(phone="+639171112222")


def _answer(response) -> tuple[int, int, str]:
    body = response.json()
    return response.status_code, body.get("code"), body.get("msg")


def _both(sender, path, registered, **params) -> tuple[tuple, tuple]:
    """The answers to the same request sent to a registered address and to an unknown one."""
    to_known = sender.client.post(path, {"account": "PHP", "target_address": registered, **params})
    to_unknown = sender.client.post(path, {"account": "PHP", "target_address": UNKNOWN, **params})
    return _answer(to_known), _answer(to_unknown)


@pytest.mark.parametrize(
    ("amount", "why"),
    [("0", "must be positive"), ("0.001", "at most 2 decimal places"), ("0.5", "below the minimum 1")],
)
def test_a_bad_amount_is_refused_alike_for_a_registered_and_an_unknown_address(
    sender, registered, create_path, amount, why
):
    known, unknown = _both(sender, create_path, registered.user.email, amount=amount)
    assert known == unknown == (400, -1025, f"Parameter 'amount' is not valid: {why}.")
    known_phone, _ = _both(sender, create_path, registered.user.phone, amount=amount)
    assert known_phone == known
    assert not Transfer.objects.exists()


def test_an_amount_over_the_balance_is_refused_alike(sender, registered, create_path):
    known, unknown = _both(sender, create_path, registered.user.email, amount="100.01")
    assert known == unknown == (400, -1131, "Balance insufficient.")
    assert_balance(sender.user, "PHP", "100")
    assert not Transfer.objects.exists()


def test_an_amount_over_the_senders_limit_is_refused_alike(sender, registered, create_path):
    tier = LimitTier.objects.create(name="small", currency="PHP")
    big = Decimal(10**9)
    TierLimit.objects.create(
        tier=tier, period="p2pDaily", cash_in_limit=big, cash_out_limit=Decimal(50), total_withdraw_limit=big
    )
    sender.user.limit_tier = tier
    sender.user.save()
    known, unknown = _both(sender, create_path, registered.user.email, amount="60")
    assert known == unknown
    assert known[:2] == (400, -1010)
    assert "limit would be exceeded" in known[2]
    assert not Transfer.objects.exists()


def test_a_good_request_to_an_unknown_address_is_the_one_refused_with_1151(sender, registered, create_path):
    response = sender.client.post(create_path, {"account": "PHP", "target_address": UNKNOWN, "amount": "10"})
    assert_error(response, -1151, 404, msg_contains="No account has this target_address")
    good = {"account": "PHP", "target_address": registered.user.email, "amount": "10"}
    response = sender.client.post(create_path, good)
    assert response.status_code == 200, response.content
    assert_balance(registered.user, "PHP", "10")
    assert_ledger_balanced()


# --- issue 34, finding 7: a reused client_transfer_id says nothing about the address ----------------


@pytest.fixture
def used_id(sender, php, create_path):
    """The sender's transfer to a friend, with client_transfer_id "used-1": the id an attacker reuses."""
    friend = customer()
    response = sender.client.post(
        create_path,
        {"account": "PHP", "target_address": friend.user.email, "amount": "10", "client_transfer_id": "used-1"},
    )
    assert response.status_code == 200, response.content
    return response.json()["transfer"]["id"]


@pytest.mark.parametrize("amount", ["5", "90.01"])  # within the balance (90 left) and over it
def test_a_reused_client_transfer_id_is_refused_alike_for_a_registered_and_an_unknown_address(
    sender, registered, create_path, used_id, amount
):
    """Issue 34, finding 7: with an id already used, a registered address answered -1010 Duplicate
    and an unknown one -1151, a free probe of who is registered. The answers are now the same."""
    known, unknown = _both(sender, create_path, registered.user.email, amount=amount, client_transfer_id="used-1")
    known_phone, malformed = (
        _answer(
            sender.client.post(
                create_path,
                {"account": "PHP", "target_address": address, "amount": amount, "client_transfer_id": "used-1"},
            )
        )
        for address in (registered.user.phone, "not-an-address")
    )
    assert known == unknown == known_phone == malformed
    if amount == "5":
        assert known == (
            400,
            -1010,
            f"Duplicate client_transfer_id: it was already used on this account by transfer {used_id}.",
        )
    else:  # the balance first, for both, as a posting would refuse it
        assert known == (400, -1131, "Balance insufficient.")
    assert Transfer.objects.count() == 1
    assert_balance(sender.user, "PHP", "90")
    assert_balance(registered.user, "PHP", "0")
    assert_ledger_balanced()


def test_an_honest_retry_is_told_its_transfer_was_made(sender, create_path, used_id):
    """A client that lost the answer and sends the same request again (same id, asset, amount and
    address) learns that the transfer it asked for was made, and which one; nothing moves again."""
    friend_email = Transfer.objects.get(pk=used_id).target_address
    again = {"account": "PHP", "target_address": friend_email, "amount": "10", "client_transfer_id": "used-1"}
    for path in (V4, V3):  # v4 and v3 share the id space
        response = sender.client.post(path, again)
        assert_error(
            response,
            -1010,
            400,
            msg_contains=f"Duplicate client_transfer_id: this transfer was already made (id {used_id}); nothing moved",
        )
    found = sender.client.get(V3, {"client_transfer_id": "used-1", "recvWindow": 5000})
    assert found.status_code == 200, found.content
    got = found.json()
    assert [t["id"] for t in got.get("transfers") or [got.get("transfer")]] == [used_id]
    assert_balance(sender.user, "PHP", "90")
    assert Transfer.objects.count() == 1


# --- finding 4: a virtual sub-account is reached from inside its family only ----------------------

CREATE = "/openapi/v1/sub-account/create"


@pytest.fixture
def family(php):
    """A master, its virtual sub-account named ceo@bigbank.example (the create call answers that
    name; the sub-account's own address is in the reserved space) and a factory-made sibling."""
    master = customer(funding={"PHP": "100"})
    name = master.client.post(CREATE, {"accountName": "ceo@bigbank.example"}).json()["email"]
    assert name == "ceo@bigbank.example"
    address = User.objects.get(master=master.user, requested_email=name).email
    sibling = customer(master=master.user, is_virtual=True, funding={"PHP": "100"})
    return master, address, sibling


def test_the_findings_reproduction_no_longer_lands_in_the_masters_family(family, sender, create_path):
    """The master named a sub-account ceo@bigbank.example; a customer sends 5 PHP there: nobody has
    that e-mail (-1151), and the sub-account's own address answers exactly as an unknown one."""
    master, address, _ = family
    assert address.endswith(f"@m{master.user.pk}.virtual.invalid")
    for target in ("ceo@bigbank.example", address, address.upper()):
        response = sender.client.post(create_path, {"account": "PHP", "target_address": target, "amount": "5"})
        unknown = sender.client.post(create_path, {"account": "PHP", "target_address": UNKNOWN, "amount": "5"})
        assert _answer(response) == _answer(unknown) == (404, -1151, "No account has this target_address.")
    assert_balance(sender.user, "PHP", "100")
    assert not Transfer.objects.exists()


def test_a_bad_amount_to_a_virtual_sub_account_answers_as_to_nobody(family, sender, create_path):
    _, address, _ = family
    known, unknown = _both(sender, create_path, address, amount="0")
    assert known == unknown


def test_inside_the_family_the_virtual_sub_account_is_reachable(family, create_path):
    master, address, sibling = family
    for who in (master, sibling):
        response = who.client.post(create_path, {"account": "PHP", "target_address": address, "amount": "5"})
        assert response.status_code == 200, response.content
    assert Transfer.objects.count() == 2
    assert_ledger_balanced()


def test_a_virtual_sub_account_made_before_with_a_real_looking_e_mail_is_not_reachable_either(
    family, sender, create_path
):
    master, _, sibling = family  # sibling: a factory-made virtual sub-account with a customer-like e-mail
    response = sender.client.post(create_path, {"account": "PHP", "target_address": sibling.user.email, "amount": "5"})
    assert_error(response, -1151, 404)
    own = master.client.post(create_path, {"account": "PHP", "target_address": sibling.user.email, "amount": "5"})
    assert own.status_code == 200, own.content


def test_the_real_owner_of_the_name_registers_and_receives(family, sender, create_path):
    real = customer(email="ceo@bigbank.example")
    response = sender.client.post(
        create_path, {"account": "PHP", "target_address": "ceo@bigbank.example", "amount": "5"}
    )
    assert response.status_code == 200, response.content
    assert_balance(real.user, "PHP", "5")
    assert_ledger_balanced()


def test_the_name_is_never_a_p2p_address_even_inside_the_family(family, create_path):
    """Issue 34: the family sees the sub-account by its name, but P2P transfers go by registered
    e-mails only. The master sending to the name reaches its real owner once there is one, never
    its own sub-account (and -1151 before, as for any unknown address)."""
    master, address, _ = family
    sub = User.objects.get(email=address)
    before = master.client.post(create_path, {"account": "PHP", "target_address": "ceo@bigbank.example", "amount": "5"})
    assert_error(before, -1151, 404)
    real = customer(email="ceo@bigbank.example")
    sent = master.client.post(create_path, {"account": "PHP", "target_address": "ceo@bigbank.example", "amount": "5"})
    assert sent.status_code == 200, sent.content
    assert_balance(real.user, "PHP", "5")
    assert_balance(sub, "PHP", "0")
    assert_balance(master.user, "PHP", "95")
    assert_ledger_balanced()
