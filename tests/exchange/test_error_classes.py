"""Errors are real classes (issue 13, item 3): every refusal is a named subclass of ExchangeError,
written as a `class` statement a reader can grep, with the code, HTTP status and message the API
has always answered; a service's refusal can be caught by its class; convert's failures render in
the convert envelope through the same exception handler."""

from __future__ import annotations

import inspect
from decimal import Decimal

import pytest
from django.urls import path
from rest_framework.response import Response

import accounts.errors
import accounts.ledger.errors
import convert.errors
import exchange.api.errors
import subaccounts.errors
import wallet.errors
from accounts import ledger
from accounts import services as account_services
from accounts.ledger.check import ledger_check
from accounts.ledger.models import Asset, BusinessType, Posting
from accounts.models import Balance, SystemRole
from exchange.api import envelope
from exchange.api.auth import Security
from exchange.api.errors import (
    BadRequest,
    ConvertError,
    ExchangeError,
    InvalidParameter,
    NoPermission,
    ParameterInvalid,
    UserNotFound,
    exception_handler,
)
from exchange.api.views import GatewayApi
from wallet import selectors as wallet_selectors
from wallet.models import Transfer
from wallet.transfers import services as transfer_services

ERROR_MODULES = (exchange.api.errors, accounts.errors, wallet.errors, convert.errors, subaccounts.errors)
# 200 only for the convert envelope (its status says how it went); everything else a 4xx or 5xx.
VALID_STATUSES = {413, 414, 400, 401, 404, 405, 418, 429, 500, 503}


def every_error_class() -> list[type[ExchangeError]]:
    found, todo = [], [ExchangeError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ in {m.__name__ for m in ERROR_MODULES}]


def test_the_walk_sees_every_module():
    modules = {cls.__module__ for cls in every_error_class()}
    assert modules == {m.__name__ for m in ERROR_MODULES}


def test_every_error_is_a_named_class_statement():
    """No `type()` factories: each class is bound to its own name in its module and defined by a
    `class` statement there (inspect finds its source), with a docstring saying when it is raised."""
    for cls in every_error_class():
        module = inspect.getmodule(cls)
        assert getattr(module, cls.__name__) is cls, cls
        assert inspect.getsource(cls).startswith(f"class {cls.__name__}("), cls
        assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"


def test_names_are_unique():
    names = [cls.__name__ for cls in every_error_class()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_codes_statuses_and_messages():
    for cls in every_error_class():
        assert cls.code < 0, cls
        assert isinstance(cls.message, str), cls
        assert cls.message, cls
        if issubclass(cls, ConvertError):
            assert cls.http_status == 200, cls
            assert cls.convert_status == envelope.STATUS_FAILED, cls
        else:
            assert cls.http_status in VALID_STATUSES, cls


def test_no_factory_functions_are_left():
    for module in (accounts.errors, wallet.errors, convert.errors, subaccounts.errors):
        functions = [name for name, value in vars(module).items() if inspect.isfunction(value)]
        assert functions == [], module.__name__
    assert not hasattr(exchange.api.errors, "error_response")
    assert not hasattr(exchange.api.errors, "_error")


@pytest.mark.parametrize(
    ("error", "base", "code", "status", "msg"),
    [
        # The messages the factory functions and `msg=` raises built before: byte for byte.
        (wallet.errors.UnknownCoin(), InvalidParameter, -1025, 400, "Parameter 'coin' is not valid."),
        (wallet.errors.UnknownNetwork(), InvalidParameter, -1025, 400, "Parameter 'network' is not valid."),
        (wallet.errors.UnknownAsset(), InvalidParameter, -1025, 400, "Parameter 'account' is not valid."),
        (
            wallet.errors.InvalidAmount("below the minimum 0.5"),
            ParameterInvalid,
            -1025,
            400,
            "Parameter 'amount' is not valid: below the minimum 0.5.",
        ),
        (
            wallet.errors.AddressNotWhitelisted(),
            ParameterInvalid,
            -1025,
            400,
            "Parameter 'address' is not valid: coin, network, address and addressTag are not in the withdrawal "
            "whitelist.",
        ),
        (
            wallet.errors.TransferToSelf(),
            ParameterInvalid,
            -1025,
            400,
            "Parameter 'target_address' is not valid: a transfer cannot go to the sender.",
        ),
        (wallet.errors.RecipientNotFound(), UserNotFound, -1151, 404, "No account has this target_address."),
        (
            wallet.errors.DepositSuspended("USDT", "TRX"),
            BadRequest,
            -1010,
            400,
            "Depositing USDT on TRX is suspended.",
        ),
        (
            wallet.errors.WithdrawalSuspended("BTC", "BTC"),
            BadRequest,
            -1010,
            400,
            "Withdrawing BTC on BTC is suspended.",
        ),
        (
            wallet.errors.LimitExceeded("daily", "cash-out"),
            BadRequest,
            -1010,
            400,
            "The daily cash-out limit would be exceeded.",
        ),
        (
            wallet.errors.DuplicateWithdrawOrderId(),
            BadRequest,
            -1010,
            400,
            "Duplicate withdrawOrderId: it was already used on this account.",
        ),
        (
            wallet.errors.DuplicateClientTransferId(),
            BadRequest,
            -1010,
            400,
            "Duplicate client_transfer_id: it was already used on this account.",
        ),
        (
            accounts.errors.AssetNotPriced("USDT"),
            BadRequest,
            -1010,
            400,
            "Moving USDT is suspended until operations set its reference price.",
        ),
        (
            accounts.errors.NotASubAccount(),
            NoPermission,
            -1152,
            401,
            "subUserId is not a sub-account of this account.",
        ),
        (
            exchange.api.errors.PeriodTooLong(90),
            InvalidParameter,
            -1025,
            400,
            "The period between startTime and endTime must be less than 90 days.",
        ),
        (
            exchange.api.errors.ParameterInvalid("page", "at most 10 rows can be skipped; narrow the query"),
            InvalidParameter,
            -1025,
            400,
            "Parameter 'page' is not valid: at most 10 rows can be skipped; narrow the query.",
        ),
        (
            exchange.api.errors.EndTimeBeforeStartTime(),
            InvalidParameter,
            -1025,
            400,
            "Parameter 'endTime' must not be before 'startTime'.",
        ),
        (
            accounts.errors.HistorySpanTooLong(),
            InvalidParameter,
            -1025,
            400,
            "The span between startTime and endTime must not exceed 7 days.",
        ),
        (
            exchange.api.errors.TimestampAhead(1500, 999),
            exchange.api.errors.TimestampOutOfWindow,
            -1021,
            400,
            "Timestamp for this request was 1500ms ahead of the server's time (at most 999ms ahead is accepted).",
        ),
        (
            exchange.api.errors.TimestampBehind(6000, 5000),
            exchange.api.errors.TimestampOutOfWindow,
            -1021,
            400,
            "Timestamp for this request is outside of the recvWindow: 6000ms behind the server's time, recvWindow "
            "is 5000ms.",
        ),
        (
            exchange.api.errors.TimestampBeforeReplayMemory(),
            exchange.api.errors.TimestampOutOfWindow,
            -1021,
            400,
            "Timestamp for this request is older than the service's replay memory (restarted moments ago); sign the "
            "request again with a fresh timestamp.",
        ),
        (
            exchange.api.errors.ReplayCheckUnavailable(),
            exchange.api.errors.Disconnected,
            -1001,
            503,
            "Internal error; unable to check this request against replay. It was not executed: sign it again and "
            "retry.",
        ),
        (
            exchange.api.errors.AccountFrozen(),
            exchange.api.errors.ApiKeyNotEnabled,
            -2015,
            401,
            "This account is frozen: its API keys are disabled. Please contact support.",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, ExchangeError) else None,
)
def test_an_app_refusal_answers_its_base_code(error, base, code, status, msg):
    assert isinstance(error, base)
    assert error.as_dict() == {"code": code, "msg": msg}
    assert error.http_status == status


def test_the_ledgers_refusal_is_answered_with_the_code_tables_row():
    """The ledger's errors are its own (accounts/ledger/errors.py): the gateway maps them, so the
    wire answer is the one the API has always given."""
    response = exception_handler(accounts.ledger.errors.InsufficientBalance(), {"request": None})
    assert (response.status_code, response.data) == (400, {"code": -1131, "msg": "Balance insufficient."})
    assert not issubclass(accounts.ledger.errors.InsufficientBalance, ExchangeError)


def test_a_sender_that_may_not_send_is_the_ledgers_refusal_answered_as_before():
    """AccountMayNotSend is raised by the ledger under its lock (and by accounts/policy.py before):
    the ledger's own class, answered with the code table's -1152 row and its own message, as the
    API has always answered it (it used to subclass the gateway's NoPermission)."""
    error = accounts.ledger.errors.AccountMayNotSend()
    response = exception_handler(error, {"request": None})
    assert (response.status_code, response.data) == (
        401,
        {
            "code": -1152,
            "msg": "This account may not send funds: it is frozen, deactivated or barred from withdrawing.",
        },
    )
    assert not issubclass(accounts.ledger.errors.AccountMayNotSend, ExchangeError)
    assert issubclass(accounts.ledger.errors.AccountMayNotSend, accounts.ledger.errors.LedgerError)


def test_msg_and_headers_still_override_one_raise():
    error = BadRequest(msg="Malformed JSON body.", headers={"Retry-After": "3"})
    assert error.as_dict() == {"code": -1010, "msg": "Malformed JSON body."}
    response = exception_handler(error, {"request": None})
    assert (response.status_code, response.data, response["Retry-After"]) == (400, error.as_dict(), "3")


# --- raised by the real services ------------------------------------------------------------------


@pytest.fixture
def funded(db):
    """A sender holding 100 TST (funded through the ledger, from the equity account) and a recipient."""
    asset = Asset.objects.create(
        code="TST", name="Test coin", transfer_precision=2, transfer_min_quantity=Decimal("0.5"), reference_price=1
    )
    sender = account_services.user_create(email="sender@errors.test", phone=None, password="pw-for-tests")
    recipient = account_services.user_create(email="recipient@errors.test", phone=None, password="pw-for-tests")
    equity = ledger.system_account_id(SystemRole.EQUITY)
    ledger.post(
        legs=[ledger.Leg(equity, asset.code, Decimal(-100)), ledger.Leg(sender.pk, asset.code, Decimal(100))],
        kind=BusinessType.DISTRIBUTION,
        reference="test:errors:funding",
    )
    return sender, recipient


def state() -> tuple:
    return (
        sorted(Balance.objects.values_list("account_id", "asset__code", "free", "locked")),
        Transfer.objects.count(),
        Posting.objects.count(),
    )


def transfer(sender, amount: str, *, target: str = "recipient@errors.test", client_id: str | None = None):
    return transfer_services.transfer_create(
        sender=sender, asset_code="TST", target_address=target, amount=Decimal(amount), client_transfer_id=client_id
    )


@pytest.mark.parametrize(
    ("amount", "why"),
    [
        ("0", "must be positive"),
        ("1.001", "at most 2 decimal places"),
        ("0.25", "below the minimum 0.5"),
    ],
)
def test_a_transfer_with_a_bad_amount_raises_invalid_amount(funded, amount, why):
    sender, _ = funded
    before = state()
    with pytest.raises(wallet.errors.InvalidAmount) as caught:
        transfer(sender, amount)
    assert caught.value.msg == f"Parameter 'amount' is not valid: {why}."
    assert caught.value.code == -1025
    assert state() == before
    assert ledger_check().ok


def test_transfer_refusals_by_class(funded):
    sender, _ = funded
    before = state()
    with pytest.raises(wallet.errors.TransferToSelf):
        transfer(sender, "1", target="sender@errors.test")
    with pytest.raises(wallet.errors.RecipientNotFound):
        transfer(sender, "1", target="nobody@errors.test")
    with pytest.raises(wallet.errors.UnknownAsset):
        transfer_services.transfer_create(
            sender=sender, asset_code="NOPE", target_address="recipient@errors.test", amount=Decimal(1)
        )
    with pytest.raises(accounts.ledger.errors.InsufficientBalance):
        transfer(sender, "100.01")
    assert state() == before


def test_a_repeated_client_transfer_id_raises_duplicate(funded):
    sender, recipient = funded
    transfer(sender, "10", client_id="once")
    after_first = state()
    with pytest.raises(wallet.errors.DuplicateClientTransferId):
        transfer(sender, "10", client_id="once")
    assert state() == after_first
    assert Balance.objects.get(account=recipient, asset__code="TST").free == Decimal(10)
    assert ledger_check().ok


def test_an_unknown_coin_or_network(db):
    with pytest.raises(wallet.errors.UnknownCoin):
        wallet_selectors.network_get(coin="NOPE", network="NOPE")


# --- the convert envelope -------------------------------------------------------------------------


CONVERT_FAILURES = [
    (convert.errors.QuoteExpired, "quote expired"),
    (convert.errors.ConvertInsufficientBalance, "insufficient balance"),
    (convert.errors.LiquidityUnavailable, "failed to fetch liquidity, try again later"),
    (convert.errors.PriceChanged, "price has changed and the updated rate must be confirmed"),
]


class ConvertProbeApi(GatewayApi):
    """Stands in for a convert endpoint: raises the failure it is told, or answers a success."""

    security = Security.NONE
    http_method_names = ["post"]

    def post(self, request):
        failure = request.query_params.get("fail")
        if failure is not None:
            raise getattr(convert.errors, failure)()
        if request.query_params.get("plain") is not None:
            raise InvalidParameter("quoteId")
        return Response(envelope.success({"orderId": "1", "status": "SUCCESS"}))


PROBE = "/openapi/convert/v1/probe"
urlpatterns = [path(PROBE.lstrip("/"), ConvertProbeApi.as_view())]  # this module is the urlconf below


def call_probe(client, query: str) -> tuple[int, dict]:
    response = client.post(
        f"{PROBE}?{query}", data="", content_type="application/x-www-form-urlencoded", REMOTE_ADDR="192.0.2.77"
    )
    assert "X-SERVICE-USED-WEIGHT-1M" in response.headers  # charged like any request, success or failure
    return response.status_code, response.json()


@pytest.mark.parametrize(("cls", "text"), CONVERT_FAILURES)
@pytest.mark.urls(__name__)
def test_a_convert_failure_is_rendered_in_the_convert_envelope(client, cls, text):
    error = cls()
    assert isinstance(error, ConvertError)
    assert error.as_envelope() == {"status": 10000003, "error": text, "data": None}
    assert call_probe(client, f"fail={cls.__name__}") == (200, {"status": 10000003, "error": text, "data": None})


@pytest.mark.urls(__name__)
def test_a_convert_endpoint_refused_before_its_logic_answers_code_and_msg(client):
    assert call_probe(client, "plain=1") == (400, {"code": -1025, "msg": "Parameter 'quoteId' is not valid."})


@pytest.mark.urls(__name__)
def test_the_success_envelope(client):
    assert call_probe(client, "") == (200, {"status": 0, "error": "OK", "data": {"orderId": "1", "status": "SUCCESS"}})
    assert envelope.success([], total=0) == {"status": 0, "error": "OK", "data": [], "total": 0}
    assert list(envelope.success([{"orderId": "1"}], total=1)) == ["status", "error", "data", "total"]


def test_the_handler_renders_a_convert_error_directly():
    response = exception_handler(convert.errors.QuoteExpired(), {"request": None})
    assert response.status_code == 200
    assert response.data == {"status": 10000003, "error": "quote expired", "data": None}
