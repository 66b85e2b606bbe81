"""The admin site staff log in to: its home (`admin:index`, /admin/) is the operations dashboard,
what is wrong and what waits for a person, for everyone who may see it; Django's model index is
one click away at /admin/models/ (`admin:models`). Staff without the dashboard's permission get the
model index as their home."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from exchange.dashboard import views


class OperationsAdminSite(admin.AdminSite):
    def get_urls(self):
        return [path("models/", self.admin_view(self.model_index), name="models"), *super().get_urls()]

    def index(self, request, extra_context=None):
        if request.user.has_perm(views.DASHBOARD_PERMISSION):
            return views.dashboard(request)
        return self.model_index(request, extra_context)

    def model_index(self, request, extra_context=None):
        """Django's index: every model the member may see, by app."""
        return super().index(request, extra_context)
