from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "Exchange operations"
admin.site.site_title = "Exchange operations"

urlpatterns = [
    path("openapi/", include("exchange.api_urls")),  # first: the busy prefix (the two never overlap)
    path("admin/backoffice/", include("exchange.dashboard.urls")),  # the dashboard and the customer page
    path("admin/", admin.site.urls),
]

# Failures outside the views (a Host not in ALLOWED_HOSTS, other SuspiciousOperations, errors in a
# middleware): the {code, msg} envelope on /openapi/ paths, Django's pages elsewhere.
handler400 = "exchange.api.handlers.bad_request"
handler403 = "exchange.api.handlers.permission_denied"
handler404 = "exchange.api.handlers.page_not_found"
handler500 = "exchange.api.handlers.server_error"
