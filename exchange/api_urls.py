"""Every /openapi/ route. The catch-all at the end answers unknown paths with the JSON envelope.

The apps' routes are spliced in (not include()d under an empty prefix): the same patterns in the
same order, but resolving a path no longer raises and catches a Resolver404 per app it passes.
"""

from django.urls import path, re_path
from drf_spectacular.views import SpectacularSwaggerView

from accounts.urls import urlpatterns as accounts_urls
from convert.urls import urlpatterns as convert_urls
from exchange.api.views import NotFoundApi
from exchange.platform.apis import OpenApiSchemaApi, PingApi, ServerTimeApi, SystemStatusApi, UserIpApi
from streams.urls import urlpatterns as streams_urls
from subaccounts.urls import urlpatterns as subaccounts_urls
from wallet.urls import urlpatterns as wallet_urls

urlpatterns = [
    path("v1/ping", PingApi.as_view(), name="ping"),
    path("v1/time", ServerTimeApi.as_view(), name="time"),
    path("v1/check-sys-status", SystemStatusApi.as_view(), name="check-sys-status"),
    path("v1/user/ip", UserIpApi.as_view(), name="user-ip"),
    *accounts_urls,
    *streams_urls,
    *wallet_urls,
    *convert_urls,
    *subaccounts_urls,
    # Charged like any request (Weight(IP) 5); the document is generated once per process.
    path("schema", OpenApiSchemaApi.as_view(), name="openapi-schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="openapi-docs"),
    re_path(r"^.*$", NotFoundApi.as_view(), name="not-found"),
]
