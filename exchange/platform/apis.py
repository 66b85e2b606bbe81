"""General endpoints: ping, time, check-sys-status, user/ip, and the OpenAPI document."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.settings import spectacular_settings
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from exchange.api.auth import server_time_ms
from exchange.api.params import Param, ParamSpec
from exchange.api.schema import openapi_rendered
from exchange.api.views import GatewayApi
from exchange.platform.models import BusinessType
from exchange.platform.presenters import business_status_json
from exchange.platform.selectors import business_status_list


class PingApi(GatewayApi):
    """Test connectivity."""

    response_example: dict = {}

    def get(self, request):
        return Response({})


class ServerTimeApi(GatewayApi):
    """Server time in ms."""

    response_example = {"serverTime": 1764000000000}

    def get(self, request):
        return Response({"serverTime": server_time_ms()})


class SystemStatusApi(GatewayApi):
    """Business status of SPOT and CONVERT (operators switch them in the admin)."""

    ip_weight = 0
    uid_weight = 2
    params_spec = ParamSpec(
        (
            Param(
                "businessType",
                "ENUM",
                choices=tuple(BusinessType.values),
                description="SPOT or CONVERT; all when omitted.",
            ),
        )
    )
    response_example = [
        {"businessType": "SPOT", "businessStatus": "on"},
        {"businessType": "CONVERT", "businessStatus": "on"},
    ]

    def get(self, request):
        rows = business_status_list(business_type=self.params["businessType"])
        return Response([business_status_json(row) for row in rows])


class UserIpApi(GatewayApi):
    """The caller's IP address as the service sees it (the one API-key IP lists are checked against)."""

    response_example = {"ip": "203.0.113.7"}

    def get(self, request):
        return Response({"ip": request._request.client_ip})


_ERROR_RENDERER = JSONRenderer()


class OpenApiSchemaApi(GatewayApi):
    """The OpenAPI document (what the Swagger UI at /openapi/docs loads): YAML by default, JSON for
    `?format=json` or an OpenAPI JSON `Accept` header. Open, but charged to the IP like any request
    (it is the largest response the service has), and generated once per process
    (exchange/api/schema.openapi_document)."""

    ip_weight = 5
    http_method_names = ["get", "head"]
    renderer_classes = [OpenApiYamlRenderer, OpenApiYamlRenderer2, OpenApiJsonRenderer, OpenApiJsonRenderer2]
    schema = None  # not an endpoint of the document it serves

    def get(self, request):
        renderer = request.accepted_renderer
        content_type = renderer.media_type + (f"; charset={renderer.charset}" if renderer.charset else "")
        response = HttpResponse(openapi_rendered(renderer), content_type=content_type)
        response["Content-Disposition"] = f'inline; filename="{spectacular_settings.TITLE}.{renderer.format}"'
        return response

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and response.status_code >= 400:
            # Refusals are the JSON envelope like everywhere under /openapi/, not a YAML rendering of it.
            response.accepted_renderer = _ERROR_RENDERER
            response.accepted_media_type = _ERROR_RENDERER.media_type
        return response
