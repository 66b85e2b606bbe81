from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "Exchange operations"
admin.site.site_title = "Exchange operations"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("openapi/", include("exchange.api_urls")),
]
