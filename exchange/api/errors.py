"""The error envelope and the code table.

Every failure leaves the service as `{"code": int, "msg": str}`. Each code has one HTTP status
(documented in docs/api.md); 5xx means "outcome unknown", so it is used only for our own faults.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class ExchangeError(Exception):
    """Base of every expected failure. Subclasses set `code`, `http_status` and `message`
    (a template filled with the positional arguments)."""

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


def _error(name: str, code: int, http_status: int, message: str) -> type[ExchangeError]:
    return type(name, (ExchangeError,), {"code": code, "http_status": http_status, "message": message})


UnknownError = _error("UnknownError", -1000, 500, "An unknown error occurred while processing the request.")
Disconnected = _error("Disconnected", -1001, 503, "Internal error; unable to process your request. Please try again.")
Unauthorized = _error(
    "Unauthorized", -1002, 401, "You are not authorized to execute this request; send the X-SERVICE-APIKEY header."
)
TooManyRequests = _error("TooManyRequests", -1003, 429, "Too many requests; current limit is %s requests per %s.")
IpBanned = _error(
    "IpBanned", -1003, 418, "Way too many requests; IP banned until %s. Please use the websocket for live updates."
)
BadRequest = _error("BadRequest", -1010, 400, "Bad request.")
NotFound = _error("NotFound", -1010, 404, "Not found: %s")
MethodNotAllowed = _error("MethodNotAllowed", -1010, 405, "Method '%s' is not allowed on this endpoint.")
TooManyOrders = _error("TooManyOrders", -1015, 429, "Too many new orders; current limit is %s orders per %s.")
UnsupportedOperation = _error(
    "UnsupportedOperation", -1020, 401, "This operation is not supported for a read-only API key; use a functional key."
)
TimestampOutOfWindow = _error(
    "TimestampOutOfWindow", -1021, 400, "Timestamp for this request is outside of the recvWindow."
)
InvalidSignature = _error("InvalidSignature", -1022, 401, "Signature for this request is not valid.")
SignatureReplayed = _error(
    "SignatureReplayed", -1022, 401, "This signature was used before: sign every request anew (replay refused)."
)
BindIpWhiteListFirst = _error(
    "BindIpWhiteListFirst", -1023, 401, "Please set an IP white list for this API key before using this endpoint."
)
MissHeader = _error("MissHeader", -1024, 400, "Header '%s' is required.")
InvalidParameter = _error("InvalidParameter", -1025, 400, "Parameter '%s' is not valid.")
CreateListenKeyRateLimit = _error(
    "CreateListenKeyRateLimit", -1026, 429, "Too many listenKeys created (%s per hour); retry next hour."
)
UnknownParam = _error("UnknownParam", -1103, 400, "A required parameter was not found; send the parameters correctly.")
MissingParameter = _error("MissingParameter", -1105, 400, "Parameter '%s' is required.")
ParameterNotRequired = _error("ParameterNotRequired", -1106, 400, "Parameter '%s' sent when not required.")
ConflictParameter = _error("ConflictParameter", -1107, 400, "Parameter '%s' should not be both set.")
ListenKeyExpired = _error("ListenKeyExpired", -1125, 400, "This listenKey does not exist.")
CreateListenKeyFailed = _error("CreateListenKeyFailed", -1126, 503, "Creating the listenKey failed; retry later.")
InsufficientBalance = _error("InsufficientBalance", -1131, 400, "Balance insufficient.")
UserNotFound = _error("UserNotFound", -1151, 404, "User not found.")
NoPermission = _error("NoPermission", -1152, 401, "Not authorized to operate this API.")
ApiKeyNotEnabled = _error("ApiKeyNotEnabled", -2015, 401, "API key not found or not enabled.")
IpNotInWhitelist = _error(
    "IpNotInWhitelist", -2017, 401, "Request IP %s is not in the API key's white list (see GET /openapi/v1/user/ip)."
)
ApiKeyNotExist = _error("ApiKeyNotExist", -2018, 401, "API key does not exist.")
ApiKeyTypeWrong = _error("ApiKeyTypeWrong", -2019, 401, "API key type is wrong; this endpoint needs '%s'.")


def error_response(error: ExchangeError) -> JsonResponse:
    response = JsonResponse(error.as_dict(), status=error.http_status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def _translate(exc: Exception, method: str) -> ExchangeError:
    if isinstance(exc, ExchangeError):
        return exc
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return MethodNotAllowed(method)
    if isinstance(exc, Http404 | drf_exceptions.NotFound):
        return NotFound("the requested resource")
    if isinstance(exc, RequestDataTooBig):
        return BadRequest(msg="Request body too large.")
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
    logger.exception("Unexpected error while handling a request", exc_info=exc)
    return UnknownError()


def exception_handler(exc: Exception, context: dict) -> Response:
    """DRF's EXCEPTION_HANDLER: every failure becomes the envelope."""
    request = context.get("request")
    error = _translate(exc, request.method if request is not None else "?")
    # The used-weight headers are added by GatewayApi.finalize_response, which every response of a
    # charged request passes through (Django's own error pages: exchange/api/handlers.py).
    return Response(error.as_dict(), status=error.http_status, headers=error.headers)
