"""The error classes, the `{code, msg}` envelope and the one exception handler.

Every failure leaves the service as `{"code": int, "msg": str}` (a convert failure as the convert
envelope, exchange/api/envelope.py). Each class below is one row of the spec's code table, or a
refusal with its own message answering one of those codes; an app's own refusals subclass these in
the app's `errors.py` (accounts/errors.py, wallet/errors.py, convert/errors.py). Each code has one
HTTP status (documented in docs/api.md); 5xx means "outcome unknown", so it is used only for our
own faults. This module imports nothing of the project's apps: they import it. A layer below the
apps with refusals of its own (the ledger, accounts/ledger/errors.py) registers which row answers
each (`answer_as`, called from its app's ready()).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from exchange.api import envelope
from exchange.runtime.outage import Outage

logger = logging.getLogger(__name__)
# A transaction of its own that failed (serialization failure, deadlock, statement cancelled or timed
# out, lock not available): -1001 too ("not executed, retry"), logged per request.
_ONE_REQUEST_STATES = frozenset({"40001", "40P01", "57014", "55P03"})
# One line when the database goes away, then one every 10 s while requests keep failing (-1001), and
# one when answers succeed again (GatewayApi.finalize_response calls ok()).
DATABASE_OUTAGE = Outage(
    logger, "Database unavailable while handling requests (answered -1001)", level=logging.WARNING, traceback=False
)


class ExchangeError(Exception):
    """Base of every expected failure. Subclasses set `code`, `http_status` and `message` (a
    template filled with the positional arguments); `msg=` replaces the message for one raise,
    `headers=` adds response headers (e.g. `Retry-After`)."""

    code: ClassVar[int] = -1000
    http_status: ClassVar[int] = 500
    message: ClassVar[str] = "An unknown error occurred while processing the request."

    def __init__(self, *args: object, msg: str | None = None, headers: dict[str, str] | None = None):
        self.args_for_message = args
        self.msg = msg if msg is not None else (self.message % args if args else self.message)
        self.headers = headers or {}
        super().__init__(self.msg)

    def as_dict(self) -> dict:
        return {"code": self.code, "msg": self.msg}

    def response_body(self) -> dict:
        """What the response carries: the `{code, msg}` envelope (a ConvertError: the convert envelope)."""
        return self.as_dict()


# --- the code table (spec, "Error codes"), in code order ------------------------------------------


class UnknownError(ExchangeError):
    """A fault of ours (logged); the outcome of the operation is unknown."""

    code = -1000
    http_status = 500
    message = "An unknown error occurred while processing the request."


class Disconnected(ExchangeError):
    """A dependency (the database; Redis: limits, replays, listenKeys) is unreachable or busy beyond its
    timeout; nothing was executed (a connection lost during COMMIT: unknown, a client id makes a retry safe)."""

    code = -1001
    http_status = 503
    message = "Internal error; unable to process your request. Please try again."


class Unauthorized(ExchangeError):
    """A keyed endpoint called without `X-SERVICE-APIKEY`."""

    code = -1002
    http_status = 401
    message = "You are not authorized to execute this request; send the X-SERVICE-APIKEY header."


class TooManyRequests(ExchangeError):
    """A weight limit (or the user data stream's message rate) exceeded: TooManyRequests(limit, period)."""

    code = -1003
    http_status = 429
    message = "Too many requests; current limit is %s requests per %s."


class IpBanned(ExchangeError):
    """An IP that kept on after a 429, until its ban ends: IpBanned(until)."""

    code = -1003
    http_status = 418
    message = "Way too many requests; IP banned until %s. Please use the websocket for live updates."


class BadRequest(ExchangeError):
    """A malformed request, or a refusal the spec has no code of its own for."""

    code = -1010
    http_status = 400
    message = "Bad request."


class RequestTooLarge(BadRequest):
    """A body or query string over the gateway's bounds (API_MAX_BODY_BYTES, API_MAX_QUERY_BYTES;
    docs/api.md, "Request size"): -1010 with 413 or 414, refused before the body is read."""

    http_status = 413
    message = "Request too large."


class QueryTooLong(RequestTooLarge):
    """A query string over API_MAX_QUERY_BYTES (-1010, 414)."""

    http_status = 414
    message = "Request line too long."


class NotFound(ExchangeError):
    """An unknown `/openapi/` path or resource: NotFound(what)."""

    code = -1010
    http_status = 404
    message = "Not found: %s"


class MethodNotAllowed(ExchangeError):
    """An HTTP method the endpoint does not serve: MethodNotAllowed(method)."""

    code = -1010
    http_status = 405
    message = "Method '%s' is not allowed on this endpoint."


class TooManyOrders(ExchangeError):
    """The order-rate limit; its code also answers a SUBSCRIBE beyond a stream connection's cap."""

    code = -1015
    http_status = 429
    message = "Too many new orders; current limit is %s orders per %s."


class UnsupportedOperation(ExchangeError):
    """A write with a read-only key."""

    code = -1020
    http_status = 401
    message = "This operation is not supported for a read-only API key; use a functional key."


class TimestampOutOfWindow(ExchangeError):
    """`timestamp` ahead of the server or older than `recvWindow` (the message says which and by how much)."""

    code = -1021
    http_status = 400
    message = "Timestamp for this request is outside of the recvWindow."


class InvalidSignature(ExchangeError):
    """A signature missing, malformed or wrong."""

    code = -1022
    http_status = 401
    message = "Signature for this request is not valid."


class SignatureReplayed(ExchangeError):
    """A signed write sent again with a signature already spent."""

    code = -1022
    http_status = 401
    message = "This signature was used before: sign every request anew (replay refused)."


class BindIpWhiteListFirst(ExchangeError):
    """An endpoint that needs an IP-restricted key, or a key restricted to an empty list."""

    code = -1023
    http_status = 401
    message = "Please set an IP white list for this API key before using this endpoint."


class MissHeader(ExchangeError):
    """A required header missing: MissHeader(name). In the spec's table; no endpoint requires one yet."""

    code = -1024
    http_status = 400
    message = "Header '%s' is required."


class InvalidParameter(ExchangeError):
    """A parameter of the wrong type, out of bounds or not one of its choices: InvalidParameter(name)."""

    code = -1025
    http_status = 400
    message = "Parameter '%s' is not valid."


class CreateListenKeyRateLimit(ExchangeError):
    """Too many listenKeys created this hour: CreateListenKeyRateLimit(limit)."""

    code = -1026
    http_status = 429
    message = "Too many listenKeys created (%s per hour); retry next hour."


class UnknownParam(ExchangeError):
    """In the spec's table; unknown parameters are ignored here, so it is not raised."""

    code = -1103
    http_status = 400
    message = "A required parameter was not found; send the parameters correctly."


class MissingParameter(ExchangeError):
    """A required parameter absent (or empty): MissingParameter(name)."""

    code = -1105
    http_status = 400
    message = "Parameter '%s' is required."


class ParameterNotRequired(ExchangeError):
    """A parameter sent where another one rules it out: ParameterNotRequired(name)."""

    code = -1106
    http_status = 400
    message = "Parameter '%s' sent when not required."


class ConflictParameter(ExchangeError):
    """Two parameters that must not both be sent: ConflictParameter("a, b")."""

    code = -1107
    http_status = 400
    message = "Parameter '%s' should not be both set."


class ListenKeyExpired(ExchangeError):
    """A listenKey unknown, expired or closed (the user data stream answers its code too)."""

    code = -1125
    http_status = 400
    message = "This listenKey does not exist."


class CreateListenKeyFailed(ExchangeError):
    """The listenKey store is unreachable when creating a key."""

    code = -1126
    http_status = 503
    message = "Creating the listenKey failed; retry later."


class InsufficientBalance(ExchangeError):
    """A debit the balance does not cover (refused by the ledger under its lock)."""

    code = -1131
    http_status = 400
    message = "Balance insufficient."


class UserNotFound(ExchangeError):
    """No (reachable) account for the given identity."""

    code = -1151
    http_status = 404
    message = "User not found."


class NoPermission(ExchangeError):
    """The caller may not do this (e.g. not the master of that sub-account, a barred sender)."""

    code = -1152
    http_status = 401
    message = "Not authorized to operate this API."


class ApiKeyNotEnabled(ExchangeError):
    """A key disabled, or its account deactivated."""

    code = -2015
    http_status = 401
    message = "API key not found or not enabled."


class IpNotInWhitelist(ExchangeError):
    """The request's IP is not in the key's list: IpNotInWhitelist(ip)."""

    code = -2017
    http_status = 401
    message = "Request IP %s is not in the API key's white list (see GET /openapi/v1/user/ip)."


class ApiKeyNotExist(ExchangeError):
    """A key that does not exist."""

    code = -2018
    http_status = 401
    message = "API key does not exist."


class RequestRepeated(ExchangeError):
    """The same request again while the first is still waiting (the spec's collect call, -10324)."""

    code = -10324
    http_status = 400
    message = "Request repeated."


class ApiKeyTypeWrong(ExchangeError):
    """A key without the functional type the endpoint needs: ApiKeyTypeWrong(key_type)."""

    code = -2019
    http_status = 401
    message = "API key type is wrong; this endpoint needs '%s'."


# --- refusals with their own message, shared by the gateway and the apps ------------------------


class ParameterInvalid(InvalidParameter):
    """An InvalidParameter that says why: ParameterInvalid(name, why)."""

    message = "Parameter '%s' is not valid: %s."


class EndTimeBeforeStartTime(InvalidParameter):
    """A history query whose endTime is before its startTime."""

    message = "Parameter 'endTime' must not be before 'startTime'."


class PeriodTooLong(InvalidParameter):
    """A history query whose startTime and endTime are too far apart: PeriodTooLong(days)."""

    message = "The period between startTime and endTime must be less than %s days."


class TimestampAhead(TimestampOutOfWindow):
    """A timestamp too far ahead of the server's clock: TimestampAhead(ms_ahead, most_ms_accepted)."""

    message = "Timestamp for this request was %sms ahead of the server's time (at most %sms ahead is accepted)."


class TimestampBehind(TimestampOutOfWindow):
    """A timestamp older than the request's recvWindow: TimestampBehind(ms_behind, recv_window)."""

    message = (
        "Timestamp for this request is outside of the recvWindow: %sms behind the server's time, recvWindow is %sms."
    )


class TimestampBeforeReplayMemory(TimestampOutOfWindow):
    """A signed write older than the replay store's memory (the store restarted moments ago)."""

    message = (
        "Timestamp for this request is older than the service's replay memory (restarted moments ago); "
        "sign the request again with a fresh timestamp."
    )


class ReplayCheckUnavailable(Disconnected):
    """A signed write while the replay store is unreachable: refused, never run unchecked."""

    message = (
        "Internal error; unable to check this request against replay. It was not executed: sign it again and retry."
    )


class AccountFrozen(ApiKeyNotEnabled):
    """Every key of a frozen account, on the REST gateway and on the user data stream."""

    message = "This account is frozen: its API keys are disabled. Please contact support."


# --- the convert envelope -------------------------------------------------------------------------


class ConvertError(ExchangeError):
    """Base of convert's failures (convert/errors.py): answered in the convert envelope with
    `convert_status` and the message, not as `{code, msg}`; HTTP 200 (docs/api.md, "Errors")."""

    code = BadRequest.code  # what as_dict() (logs) says; the envelope carries convert_status
    http_status = 200
    convert_status: ClassVar[int] = envelope.STATUS_FAILED
    message = "conversion failed"

    def as_envelope(self) -> dict:
        return envelope.failure(self.convert_status, self.msg)

    def response_body(self) -> dict:
        return self.as_envelope()


# --- the handler ----------------------------------------------------------------------------------

# Exceptions of other layers answered with a row of the table: raised type -> (the row's class,
# whether the raised exception's text is the message).
_ANSWERS: dict[type[Exception], tuple[type[ExchangeError], bool]] = {}


def answer_as(raised: type[Exception], answer: type[ExchangeError], *, keep_message: bool = False) -> None:
    """Answer `raised` (and its subclasses) wherever it reaches the gateway as `answer()`: its
    code, HTTP status and message (with `keep_message`, the raised exception's own text). How a
    layer that must not import the gateway (the ledger) gets its refusals answered."""
    _ANSWERS[raised] = (answer, keep_message)


def _translate(exc: Exception, method: str) -> ExchangeError:
    if isinstance(exc, ExchangeError):
        return exc
    for raised, (answer, keep_message) in _ANSWERS.items():
        if isinstance(exc, raised):
            return answer(msg=str(exc)) if keep_message else answer()
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return MethodNotAllowed(method)
    if isinstance(exc, Http404 | drf_exceptions.NotFound):
        return NotFound("the requested resource")
    if isinstance(exc, RequestDataTooBig):
        return RequestTooLarge(msg="Request body too large.")
    if isinstance(exc, drf_exceptions.ParseError | SuspiciousOperation | UnicodeDecodeError):
        return BadRequest(msg="Malformed request.")
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        return Unauthorized()
    if isinstance(exc, PermissionDenied | drf_exceptions.PermissionDenied):
        return NoPermission()
    if isinstance(exc, drf_exceptions.Throttled):
        return TooManyRequests("?", "minute")
    if isinstance(exc, drf_exceptions.APIException) and 400 <= exc.status_code < 500:
        return BadRequest(msg=str(exc.detail))
    if isinstance(exc, DatabaseOperationalError | DatabaseInterfaceError):
        # The database is away (restarting, unreachable, every pooled connection busy beyond
        # DB_POOL_TIMEOUT) or the connection broke: the transaction did not commit, or (a connection
        # lost during COMMIT) its outcome is unknown; a retry with the same client id is safe.
        state = getattr(exc.__cause__, "sqlstate", None)
        if state in _ONE_REQUEST_STATES:  # this request's transaction, not the database, failed
            logger.warning("Database refused this request (SQLSTATE %s): %s", state, str(exc).strip()[:300])
        else:
            DATABASE_OUTAGE.failed(exc)
        return Disconnected()
    logger.exception("Unexpected error while handling a request", exc_info=exc)
    return UnknownError()


def exception_handler(exc: Exception, context: dict) -> Response:
    """DRF's EXCEPTION_HANDLER: every failure becomes the envelope (a ConvertError the convert envelope)."""
    request = context.get("request")
    error = _translate(exc, request.method if request is not None else "?")
    # The used-weight headers are added by GatewayApi.finalize_response, which every response of a
    # charged request passes through (Django's own error pages: exchange/api/handlers.py).
    return Response(error.response_body(), status=error.http_status, headers=error.headers)
