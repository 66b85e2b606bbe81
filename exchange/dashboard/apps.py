"""The back office's read side as an app (its rollup, periodic task, commands, templates, template
filters, static files), and the admin app with the operations site as its default site
(INSTALLED_APPS names OperationsAdminConfig instead of "django.contrib.admin"; every
`admin.site.register` lands on it)."""

from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class DashboardConfig(AppConfig):
    name = "exchange.dashboard"
    label = "dashboard"
    verbose_name = "Operations dashboard"


class OperationsAdminConfig(AdminConfig):
    default_site = "exchange.dashboard.site.OperationsAdminSite"
