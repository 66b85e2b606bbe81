"""Every /openapi/ route. The catch-all at the end answers unknown paths with the JSON envelope."""

from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from exchange.api.views import NotFoundApi
from exchange.apis import PingApi, ServerTimeApi, SystemStatusApi, UserIpApi

urlpatterns = [
    path("v1/ping", PingApi.as_view(), name="ping"),
    path("v1/time", ServerTimeApi.as_view(), name="time"),
    path("v1/check-sys-status", SystemStatusApi.as_view(), name="check-sys-status"),
    path("v1/user/ip", UserIpApi.as_view(), name="user-ip"),
    path("", include("accounts.urls")),
    path("", include("streams.urls")),
    path("", include("wallet.urls")),
    path("schema", SpectacularAPIView.as_view(), name="openapi-schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="openapi-docs"),
    re_path(r"^.*$", NotFoundApi.as_view(), name="not-found"),
]
