"""The admin app with the operations site as its default site (INSTALLED_APPS names this config
instead of "django.contrib.admin"; every `admin.site.register` lands on it)."""

from django.contrib.admin.apps import AdminConfig


class OperationsAdminConfig(AdminConfig):
    default_site = "exchange.dashboard.site.OperationsAdminSite"
