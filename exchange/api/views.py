"""`GatewayApi`: the base of every endpoint. A subclass declares its security type, weights, key
type and parameters; `initial()` runs the gateway before the handler, in this order:

1. method allowed (405), parameters merged from query string and body (-1010 on a malformed body);
2. authentication for the security type (key, signature, timing, status, type, IP list); a write
   signed without a timestamp (the collect call only) spends its signature as soon as it verifies,
   whatever follows (-1022 for a replay; exchange/api/untimed.py), also when a limit or a ban
   refused it before its key was looked up;
3. the charge: IP ban (418), IP and UID weights (429, then 418 for continuing) and, for a timed
   signed write, the replay check of its signature (-1022; remembered only when the request passed
   every check so far), in one storage round trip. A refusal from steps 1-2 is charged to the IP first
   (its IP weight, and at least REFUSAL_WEIGHT on an endpoint of IP weight 0), so a limit or ban
   outranks it and failing is never free; a key that is not in the process's keyring cache is
   charged before the database is asked (and the keyring asks about an unknown key once per
   API_KEY_CACHE_SECONDS);
4. the endpoint's parameters parsed and checked (-1105, -1025, -1106, -1107) into `self.params`.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from exchange.api.auth import SIGNING_PARAMS, EndpointAuth, RawRequest, Security, authenticate, key_store
from exchange.api.errors import (
    DATABASE_OUTAGE,
    ApiKeyTypeWrong,
    BadRequest,
    MethodNotAllowed,
    NotFound,
    QueryTooLong,
    RequestTooLarge,
)
from exchange.api.params import ParamSpec, body_pairs_from, is_json, merge_params, split_pairs
from exchange.api.ratelimit import REFUSAL_WEIGHT, apply_weight_headers, charge

READ_METHODS = frozenset({"GET", "HEAD"})
_JSON_RENDERER = JSONRenderer()  # stateless: one instance serves every request
_PLAIN_ACCEPT = frozenset({"*/*", "application/json"})
_DEFAULT_HEADERS: dict[type, dict[str, str]] = {}
_ENDPOINT_AUTH: dict[type, dict[str, EndpointAuth]] = {}  # per view class and method: declarations only


def _check_size(meta: dict, query: str) -> None:
    """A signed request is small (docs/api.md, "Request size"): a query string over
    API_MAX_QUERY_BYTES is refused with 414, a body announced over API_MAX_BODY_BYTES with 413, both
    -1010 and before the body is read (the front, nginx, refuses them earlier with the same answer)."""
    if len(query) > settings.API_MAX_QUERY_BYTES:
        raise QueryTooLong(
            msg=f"Request line too long: the query string is limited to {settings.API_MAX_QUERY_BYTES} bytes."
        )
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise BadRequest(msg="Malformed Content-Length.") from None
    if length > settings.API_MAX_BODY_BYTES:
        raise RequestTooLarge(msg=f"Request body too large: at most {settings.API_MAX_BODY_BYTES} bytes.")


def _spend_untimed(endpoint: EndpointAuth, raw: RawRequest) -> None:
    """A request refused before its key was looked up (a limit or a ban on an uncached key): on an
    endpoint that takes untimed signatures, check it now only to spend an untimed signature that
    verifies (exchange/api/untimed.py), so that the refused request cannot run when replayed after
    the limit or the ban is over (issue 34, finding 8). Its own answer stays the refusal; a timed
    or bad request is not recorded."""
    with contextlib.suppress(Exception):
        authenticate(endpoint, raw)


class GatewayApi(APIView):
    security: ClassVar[Security] = Security.NONE
    ip_weight: ClassVar[int] = 1
    uid_weight: ClassVar[int] = 0
    key_type: ClassVar[str | None] = None
    ip_whitelist_required: ClassVar[bool] = False
    # Whether a call moves or changes something (a read-only key is refused, -1020). None: every
    # method but GET and HEAD.
    is_write: ClassVar[bool | None] = None
    # A signed call may come without a timestamp (auth.EndpointAuth.timestamp_optional): only where
    # the spec lists none and the endpoint's own unique business key makes a repeat harmless.
    timestamp_optional: ClassVar[bool] = False
    # One ParamSpec for every method, or one per method ("GET", "POST", ...).
    params_spec: ClassVar[ParamSpec | dict[str, ParamSpec]] = ParamSpec()
    # For the OpenAPI document: a short description of the response and an example of it.
    response_example: ClassVar[Any] = None
    http_method_names: ClassVar[list[str]] = ["get", "post", "put", "delete", "head"]
    # Per-method overrides of the declarations above, when one path serves two endpoints:
    # {"GET": {"ip_weight": 10, "uid_weight": 10}}.
    per_method: ClassVar[dict[str, dict[str, Any]]] = {}

    params: dict[str, Any]
    api_key = None  # accounts.keyring.KeyRecord of the caller (never the model: see keyring.py)
    account = None  # accounts.models.User of the caller

    def option(self, name: str, method: str) -> Any:
        return self.per_method.get(method, {}).get(name, getattr(self, name))

    def spec_for(self, method: str) -> ParamSpec:
        spec = self.params_spec
        if isinstance(spec, dict):
            return spec.get(method, ParamSpec())
        return spec

    def initial(self, request, *args, **kwargs) -> None:
        http_request = request._request
        ip = http_request.client_ip
        ip_paid: int | None = 0  # IP weight this request has paid; None: its charge was refused (429/418)
        method = request.method
        ip_weight, uid_weight = self.option("ip_weight", method), self.option("uid_weight", method)
        raw = None
        try:
            _check_size(http_request.META, http_request.META.get("QUERY_STRING", ""))  # before anything else
            super().initial(request, *args, **kwargs)  # content negotiation may refuse: charged too
            if method.lower() not in self.http_method_names or not hasattr(self, method.lower()):
                raise MethodNotAllowed(method)
            raw = self._raw_request(http_request, ip)
            if self.security.needs_key and not key_store().cached(raw.meta.get("HTTP_X_SERVICE_APIKEY", "").strip()):
                # The key must come from the database: count the IP (and refuse a banned one) first.
                ip_paid = None
                charge(http_request, ip=ip, ip_weight=ip_weight)
                ip_paid = ip_weight
            caller = authenticate(self._endpoint_auth(method), raw)
        except Exception:
            if ip_paid is None and raw is not None and self.timestamp_optional:
                _spend_untimed(self._endpoint_auth(method), raw)
            # Whatever a request ends in, its IP pays its weight, and a refusal before the caller is
            # known at least REFUSAL_WEIGHT, also on endpoints of IP weight 0 (issue 25, finding 5:
            # unknown keys cost a database look-up each). A limit or a ban outranks the reason for
            # refusing; a request whose own charge was refused is not charged again.
            if ip_paid is not None and (owed := max(ip_weight, REFUSAL_WEIGHT) - ip_paid) > 0:
                charge(http_request, ip=ip, ip_weight=owed)
            raise
        if caller is None:  # NONE: a UID weight falls on the IP
            charge(http_request, ip=ip, ip_weight=ip_weight + uid_weight)
        else:
            self.api_key, self.account = caller.api_key, caller.account
            # With the weights, a signed write's signature is checked against replay and remembered
            # (-1022 for a replay, charged to the IP only, as for any other authentication refusal).
            charge(
                http_request,
                ip=ip,
                ip_weight=ip_weight - (ip_paid or 0),
                uid=self.account.pk,
                uid_weight=uid_weight,
                signature=caller.signature,
            )
        self.params = self.spec_for(method).parse(raw.params)

    def require_key_type(self, key_type: str) -> None:
        """For endpoints whose key type depends on a parameter (a transfer of fiat needs Enable Fiat,
        of crypto Enable Crypto Wallet): refuse the caller's key if it lacks `key_type` (-2019)."""
        if key_type not in self.api_key.types:
            raise ApiKeyTypeWrong(key_type)

    @staticmethod
    def _raw_request(http_request, ip: str) -> RawRequest:
        query = http_request.META.get("QUERY_STRING", "")
        if isinstance(http_request, WSGIRequest) and not query.isascii():
            # WSGI hands the query string over as Latin-1; ASGI as UTF-8. Sign and parse the UTF-8 text.
            try:
                query = query.encode("iso-8859-1").decode("utf-8")
            except UnicodeError as exc:
                raise BadRequest(msg="Malformed query string: not UTF-8.") from exc
        body_text, body_pairs = body_pairs_from(http_request.META.get("CONTENT_TYPE", ""), http_request.body)
        query_pairs = split_pairs(query)
        return RawRequest(
            meta=http_request.META,
            query=query,
            body=body_text,
            query_pairs=query_pairs,
            body_pairs=body_pairs,
            params=merge_params(query, body_text, body_pairs, query_pairs),
            ip=ip,
            body_is_json=bool(body_text) and is_json(http_request.META.get("CONTENT_TYPE", "")),
        )

    def _endpoint_auth(self, method: str) -> EndpointAuth:
        cache = _ENDPOINT_AUTH.setdefault(type(self), {})
        found = cache.get(method)
        if found is None:
            found = cache[method] = EndpointAuth(
                security=self.security,
                key_type=self.key_type,
                writes=method not in READ_METHODS if self.is_write is None else self.is_write,
                ip_whitelist_required=self.ip_whitelist_required,
                param_names=frozenset(param.name for param in self.spec_for(method).params) | SIGNING_PARAMS,
                timestamp_optional=self.timestamp_optional,
            )
        return found

    def perform_authentication(self, request) -> None:
        """DRF's authentication is configured empty: the gateway authenticates in `initial()`. DRF
        would find that out through `request.user`, whose first look-up misses twice with
        AttributeErrors (a measurable share of a cheap request); with no authenticators, mark the
        request unauthenticated directly, exactly as DRF ends up doing. Views that declare their
        own authentication classes still get DRF's full path."""
        if request.authenticators:
            super().perform_authentication(request)
        else:
            request._not_authenticated()

    def perform_content_negotiation(self, request, force=False):
        """JSON is the only renderer. DRF's negotiation parses the Accept header on every request
        (a measurable share of a cheap request); a request that accepts anything or JSON, with no
        format override, gets JSON without it. Any other request is negotiated by DRF as before
        (`Accept: text/html` is refused, `application/json; indent=4` is honoured, `?format=xml`
        is a 404)."""
        meta = request._request.META
        accept = meta.get("HTTP_ACCEPT")
        override = api_settings.URL_FORMAT_OVERRIDE
        if (
            (accept is None or accept in _PLAIN_ACCEPT)
            and self._json_only()
            and not getattr(self, "format_kwarg", None)
            and not (override and override in meta.get("QUERY_STRING", ""))
        ):
            return _JSON_RENDERER, JSONRenderer.media_type
        return super().perform_content_negotiation(request, force)

    def _json_only(self) -> bool:
        renderers = self.renderer_classes
        return len(renderers) == 1 and renderers[0] is JSONRenderer

    @property
    def default_response_headers(self) -> dict[str, str]:
        """DRF's `Allow` (and `Vary`) headers, worked out once per view class instead of per request."""
        cls = type(self)
        headers = _DEFAULT_HEADERS.get(cls)
        if headers is None:
            headers = _DEFAULT_HEADERS[cls] = super().default_response_headers
        return dict(headers)  # finalize_response pops from it

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        apply_weight_headers(request, response)
        if response.status_code < 500:
            DATABASE_OUTAGE.ok()  # one attribute read unless an outage is being logged
        return response


class NotFoundApi(GatewayApi):
    """Any /openapi/ path that is not an endpoint: counted like a request, answered with JSON."""

    http_method_names: ClassVar[list[str]] = ["get", "post", "put", "delete", "patch", "head", "options"]
    schema = None

    def initial(self, request, *args, **kwargs) -> None:
        http_request = request._request
        charge(http_request, ip=http_request.client_ip, ip_weight=REFUSAL_WEIGHT)
        raise NotFound(http_request.path)

    def get(self, request, *args, **kwargs) -> Response:  # pragma: no cover - initial() always raises
        raise NotFound(request.path)
