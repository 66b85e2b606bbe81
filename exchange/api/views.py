"""`GatewayApi`: the base of every endpoint. A subclass declares its security type, weights, key
type and parameters; `initial()` runs the gateway before the handler, in this order:

1. IP ban (418), IP weight (429, then 418 for continuing);
2. method allowed (405), parameters merged from query string and body (-1010 on a malformed body);
3. authentication for the security type (key, signature, timing, status, type, IP list);
4. UID weight (the caller's account; the IP when the endpoint is NONE);
5. the endpoint's parameters parsed and checked (-1105, -1025, -1106, -1107) into `self.params`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework.response import Response
from rest_framework.views import APIView

from exchange.api import ratelimit
from exchange.api.auth import EndpointAuth, RawRequest, Security, authenticate
from exchange.api.errors import MethodNotAllowed, NotFound
from exchange.api.params import ParamSpec, body_pairs_from, merge_params, split_pairs

READ_METHODS = frozenset({"GET", "HEAD"})


class GatewayApi(APIView):
    security: ClassVar[Security] = Security.NONE
    ip_weight: ClassVar[int] = 1
    uid_weight: ClassVar[int] = 0
    key_type: ClassVar[str | None] = None
    ip_whitelist_required: ClassVar[bool] = False
    # One ParamSpec for every method, or one per method ("GET", "POST", ...).
    params_spec: ClassVar[ParamSpec | dict[str, ParamSpec]] = ParamSpec()
    # For the OpenAPI document: a short description of the response and an example of it.
    response_example: ClassVar[Any] = None
    http_method_names: ClassVar[list[str]] = ["get", "post", "put", "delete", "head"]

    params: dict[str, Any]
    api_key = None
    account = None

    def spec_for(self, method: str) -> ParamSpec:
        spec = self.params_spec
        if isinstance(spec, dict):
            return spec.get(method, ParamSpec())
        return spec

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        http_request = request._request
        ip = http_request.client_ip
        ratelimit.check_ban(ip)
        ratelimit.hit(request, counter="ip", identifier=ip, weight=self.ip_weight, ip=ip)

        method = request.method
        if method.lower() not in self.http_method_names or not hasattr(self, method.lower()):
            raise MethodNotAllowed(method)

        query = http_request.META.get("QUERY_STRING", "")
        body_text, body_pairs = body_pairs_from(http_request.META.get("CONTENT_TYPE", ""), http_request.body)
        query_pairs = split_pairs(query)
        merged = merge_params(query, body_text, body_pairs)
        raw = RawRequest(
            meta=http_request.META,
            query=query,
            body=body_text,
            query_pairs=query_pairs,
            body_pairs=body_pairs,
            params=merged,
            ip=ip,
        )
        endpoint = EndpointAuth(
            security=self.security,
            key_type=self.key_type,
            writes=method not in READ_METHODS,
            ip_whitelist_required=self.ip_whitelist_required,
        )
        self.api_key = authenticate(endpoint, raw)
        self.account = self.api_key.user if self.api_key is not None else None

        if self.uid_weight:
            if self.account is not None:
                ratelimit.hit(request, counter="uid", identifier=str(self.account.pk), weight=self.uid_weight, ip=ip)
            else:
                ratelimit.hit(request, counter="ip", identifier=ip, weight=self.uid_weight, ip=ip)
        self.params = self.spec_for(method).parse(merged)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        ratelimit.apply_weight_headers(request, response)
        return response


class NotFoundApi(GatewayApi):
    """Any /openapi/ path that is not an endpoint: counted like a request, answered with JSON."""

    http_method_names: ClassVar[list[str]] = ["get", "post", "put", "delete", "patch", "head", "options"]
    schema = None

    def initial(self, request, *args, **kwargs) -> None:
        http_request = request._request
        ratelimit.check_ban(http_request.client_ip)
        ratelimit.hit(request, counter="ip", identifier=http_request.client_ip, weight=1, ip=http_request.client_ip)
        raise NotFound(http_request.path)

    def get(self, request, *args, **kwargs) -> Response:  # pragma: no cover - initial() always raises
        raise NotFound(request.path)
