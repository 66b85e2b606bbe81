"""The dashboard and the customer page: thin views inside the admin (login, staff check and the
admin's look through `admin.site.admin_view` and its base template); the reads are in selectors.py."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse

from accounts.models import User
from exchange.dashboard import selectors

# Who may see them: the dashboard shows every account's totals, the customer page one account.
DASHBOARD_PERMISSION = "accounts.view_balance"
CUSTOMER_PERMISSION = "accounts.view_user"


def _require(request, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise PermissionDenied


def dashboard(request):
    _require(request, DASHBOARD_PERMISSION)
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        **selectors.dashboard_get(),
    }
    return TemplateResponse(request, "backoffice/dashboard.html", context)


def customer(request, user_id: int | None = None):
    _require(request, CUSTOMER_PERMISSION)
    query = request.GET.get("q", "").strip()
    found: list[User] = []
    shown: User | None = None
    if user_id is not None:
        shown = get_object_or_404(User, pk=user_id, system_role__isnull=True)
    elif query:
        found = selectors.customer_search(query)
        if len(found) == 1:
            shown = found[0]
    context = {
        **admin.site.each_context(request),
        "title": f"Customer {shown.email}" if shown else "Customer search",
        "query": query,
        "found": found,
        "searched": bool(query),
    }
    if shown is not None:
        context.update(selectors.customer_get(user=shown))
    return TemplateResponse(request, "backoffice/customer.html", context)
