"""Django's error views (handler400/403/404/500 in exchange/urls.py) for failures that happen
outside the gateway's views, where DRF's exception handler never sees them: a `Host` header not in
ALLOWED_HOSTS (raised by CommonMiddleware before any view runs), any other SuspiciousOperation
Django turns into a 400, an error view reached without a DRF view, an exception in a middleware.

Every /openapi/ path answers the `{code, msg}` envelope, whatever the failure; other paths (the
admin) keep Django's own pages. A refusal is charged to the IP like any request (weight 1, unless
a view already charged it), so a client flooding bad requests meets its limit and its ban; a fault
of ours (500) is not charged. The handlers read only the path and the peer's address: a request
refused for its Host must not have `get_host()` or `build_absolute_uri()` called again.
"""

from __future__ import annotations

from django.core.exceptions import DisallowedHost
from django.http import JsonResponse
from django.views import defaults

from exchange.api.errors import (
    BadRequest,
    ExchangeError,
    NoPermission,
    NotFound,
    UnknownError,
)
from exchange.api.middleware import API_PREFIX, client_ip
from exchange.api.ratelimit import REFUSAL_WEIGHT, apply_weight_headers, charge


def _is_openapi(request) -> bool:
    return request.path_info.startswith(API_PREFIX)


def _envelope(error: ExchangeError) -> JsonResponse:
    return JsonResponse(error.response_body(), status=error.http_status, headers=error.headers)


def _refuse(request, error: ExchangeError):
    """The envelope of `error`, or of the limit or ban the request's charge runs into (they outrank it)."""
    if getattr(request, "_used_weight", None) is None:  # not charged by a view yet
        ip = getattr(request, "client_ip", None) or client_ip(request.META)
        try:
            charge(request, ip=ip, ip_weight=REFUSAL_WEIGHT)
        except ExchangeError as limit:
            error = limit
    response = _envelope(error)
    apply_weight_headers(request, response)
    return response


def bad_request(request, exception, template_name=defaults.ERROR_400_TEMPLATE_NAME):
    if _is_openapi(request):
        if isinstance(exception, DisallowedHost):
            return _refuse(request, BadRequest(msg="Host header not accepted."))
        return _refuse(request, BadRequest(msg="Malformed request."))
    return defaults.bad_request(request, exception, template_name)


def permission_denied(request, exception, template_name=defaults.ERROR_403_TEMPLATE_NAME):
    if _is_openapi(request):
        return _refuse(request, NoPermission())
    return defaults.permission_denied(request, exception, template_name)


def page_not_found(request, exception, template_name=defaults.ERROR_404_TEMPLATE_NAME):
    if _is_openapi(request):
        return _refuse(request, NotFound(request.path_info))
    return defaults.page_not_found(request, exception, template_name)


def server_error(request, template_name=defaults.ERROR_500_TEMPLATE_NAME):
    if _is_openapi(request):
        return _envelope(UnknownError())  # Django has logged the exception already
    return defaults.server_error(request, template_name)
