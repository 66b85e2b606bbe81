"""URLs for the gateway tests: a few test-only endpoints (defined in tests/exchange/test_gateway_auth.py)
in front of the real /openapi/ routes, so that the rest keeps working under this urlconf."""

from django.urls import include, path

from tests.exchange.test_gateway_auth import ConvertKeyApi, EchoApi, WhitelistRequiredApi

urlpatterns = [
    path("openapi/test/echo", EchoApi.as_view(), name="test-echo"),
    path("openapi/test/convert-only", ConvertKeyApi.as_view(), name="test-convert-only"),
    path("openapi/test/whitelist-required", WhitelistRequiredApi.as_view(), name="test-whitelist-required"),
    path("openapi/", include("exchange.api_urls")),
]
