from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "Exchange operations"
admin.site.site_title = "Exchange operations"

urlpatterns = [
    path("openapi/", include("exchange.api_urls")),  # first: the busy prefix (the two never overlap)
    path("admin/", admin.site.urls),
]
