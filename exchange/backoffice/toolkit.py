"""The admin's safety (docs/operations.md, "Staff sessions and the admin's safety"):

- `AdminHostsMiddleware`: with ADMIN_HOSTS set, the admin answers only on those hosts; on any other
  (the public API's hosts) its paths are a plain 404, as if it did not exist.
- `ThrottledAdminLoginForm`: failed logins are counted per client IP and per username in the
  rate-limit storage (Redis in the full stack, shared by every process); past the limits the login
  is refused with a clear message, whatever the password, until the window has passed.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from limits import RateLimitItemPerSecond
from limits.strategies import FixedWindowRateLimiter

from exchange.api import ratelimit
from exchange.api.middleware import client_ip
from exchange.backoffice.services import REASON_REQUIRED


@lru_cache(maxsize=1)
def admin_prefix() -> str:
    return reverse("admin:index")


def is_admin_path(path_info: str) -> bool:
    return path_info.startswith(admin_prefix())


def admin_host_allowed(host: str) -> bool:
    allowed = [name.strip().lower() for name in settings.ADMIN_HOSTS if name.strip()]
    if not allowed:
        return True
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # drop the port
    return name.lower() in allowed


class AdminHostsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if settings.ADMIN_HOSTS and is_admin_path(request.path_info) and not admin_host_allowed(request.get_host()):
            raise Http404("Not found.")
        return self.get_response(request)


# --- login throttling ------------------------------------------------------------------------------

LOGIN_REFUSED = (
    "Too many failed logins from this address or for this account. Login is refused for now: "
    "try again in %(minutes)s minute(s), or ask an administrator."
)


def _limiter() -> FixedWindowRateLimiter:
    return FixedWindowRateLimiter(ratelimit.storage())


def _items() -> tuple[RateLimitItemPerSecond, RateLimitItemPerSecond]:
    window = settings.ADMIN_LOGIN_WINDOW_SECONDS
    return (
        RateLimitItemPerSecond(settings.ADMIN_LOGIN_FAILURES_PER_IP, window, namespace="admin-login-ip"),
        RateLimitItemPerSecond(settings.ADMIN_LOGIN_FAILURES_PER_USERNAME, window, namespace="admin-login-user"),
    )


def _username_key(username: str) -> str:
    # Hashed: the storage never holds the typed e-mail addresses (or passwords typed into the field).
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]


def login_allowed(*, ip: str, username: str) -> bool:
    per_ip, per_user = _items()
    limiter = _limiter()
    return limiter.test(per_ip, ip) and limiter.test(per_user, _username_key(username))


def login_failed(*, ip: str, username: str) -> None:
    per_ip, per_user = _items()
    limiter = _limiter()
    limiter.hit(per_ip, ip)
    limiter.hit(per_user, _username_key(username))


class ThrottledAdminLoginForm(AdminAuthenticationForm):
    """The admin's login form, counting failures (admin.site.login_form, set in exchange/backoffice/admin.py)."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        ip = getattr(self.request, "client_ip", None) or client_ip(self.request.META)
        if not login_allowed(ip=ip, username=username):
            minutes = max(1, settings.ADMIN_LOGIN_WINDOW_SECONDS // 60)
            raise ValidationError(LOGIN_REFUSED, code="throttled", params={"minutes": minutes})
        try:
            return super().clean()
        except ValidationError:
            login_failed(ip=ip, username=username)
            raise


# --- reasons for the admin's actions ---------------------------------------------------------------


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record nobody edits in the admin (journal, audit trail, change requests, quotes, orders,
    sub-account transfers, ...): it is written only by its service, with its posting."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyTabularInline(admin.TabularInline):
    """The rows of such a record shown on its page (e.g. a fund collection's outcomes), read-only."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReasonActionForm(helpers.ActionForm):
    """The changelist's action bar with a reason field: every action that changes something records
    why (exchange.backoffice.services.staff_action) and is refused without one."""

    reason = forms.CharField(
        required=False,
        max_length=500,
        label="Reason",
        widget=forms.TextInput(attrs={"size": 40, "placeholder": "why (required, audited)"}),
    )


def action_reason(model_admin, request) -> str | None:
    """The reason sent with a changelist action, or None after telling the user it is required."""
    reason = (request.POST.get("reason") or "").strip()
    if not reason:
        model_admin.message_user(request, REASON_REQUIRED, messages.ERROR)
        return None
    return reason


def submit_to_each(model_admin, request, queryset, changes: dict, *, done: str, waits: str) -> None:
    """A reason-taking changelist action that makes the same guarded change (exchange/backoffice/changes.py) to
    every selected row: applied at once where it loosens nothing, otherwise proposed; tells the user
    how many rows `done` ("{n} network(s) switched.") and which proposals wait (`waits` says why)."""
    from exchange.backoffice import changes as guarded_changes

    reason = action_reason(model_admin, request)
    if reason is None:
        return
    applied, proposed = 0, []
    for row in queryset:
        try:
            outcome = guarded_changes.change_submit(actor=request.user, obj=row, changes=changes, reason=reason)
        except guarded_changes.ChangeRefused as exc:
            model_admin.message_user(request, f"Refused: {exc}", messages.ERROR)
            continue
        if outcome.request is not None:
            proposed.append(f"#{outcome.request.pk}")
        elif outcome.applied:
            applied += 1
    model_admin.message_user(request, done.format(n=applied), messages.SUCCESS)
    if proposed:
        model_admin.message_user(
            request, f"Proposed (change requests {', '.join(proposed)}): {waits}", messages.WARNING
        )


class ReasonFormMixin(forms.Form):
    """A required reason on an admin change form that acts on money or permissions."""

    reason = forms.CharField(
        max_length=500,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Why you make this change; kept in the audit trail with your name.",
    )


class ReasonFieldAdmin:
    """For a ModelAdmin whose form has a `reason` field: the field is left out of a page the user
    may only view (a read-only page has nothing to give a reason for), and put last."""

    def get_fields(self, request, obj=None):
        fields = [name for name in super().get_fields(request, obj) if name != "reason"]
        may_write = self.has_change_permission(request, obj) if obj is not None else self.has_add_permission(request)
        return [*fields, "reason"] if may_write else fields


# --- settings that matter to money (exchange/backoffice/changes.py) -------------------------------------------


class GuardedChangeForm(ReasonFormMixin, forms.ModelForm):
    """The form of a GuardedChangeAdmin: the model's fields and a required reason."""


class ChangeOutcomeResponses:
    """The answers of a change page whose save went through exchange.backoffice.changes.change_submit (its
    save_model sets request._change_outcome, or request._change_refused with the reason): a
    refusal or a proposal is said so, and not logged as a change (nothing changed)."""

    def log_change(self, request, obj, message):
        outcome = getattr(request, "_change_outcome", None)
        if getattr(request, "_change_refused", None) or (outcome is not None and not outcome.applied):
            return None  # nothing changed; the audit trail has the proposal
        return super().log_change(request, obj, message)

    def response_change(self, request, obj):
        refused = getattr(request, "_change_refused", None)
        here = HttpResponseRedirect(request.path)
        if refused is not None:
            self.message_user(request, f"Refused: {refused}", messages.ERROR)
            return here
        outcome = getattr(request, "_change_outcome", None)
        if outcome is not None and outcome.request is not None:
            self.message_user(
                request,
                f"Proposed as change request #{outcome.request.pk}: nothing has changed yet. It loosens a "
                f"control ({', '.join(outcome.request.loosens)}), so another Administrator must approve it.",
                messages.WARNING,
            )
            return HttpResponseRedirect(reverse("admin:exchange_changerequest_change", args=[outcome.request.pk]))
        return super().response_change(request, obj)


class GuardedChangeAdmin(ChangeOutcomeResponses, ReasonFieldAdmin):
    """For the ModelAdmin of a model declared with exchange.backoffice.changes.guard. A change made on its page
    goes through exchange.backoffice.changes.change_submit: applied at once (audited) when it loosens nothing,
    otherwise proposed, and applied only when a second Administrator approves it (Service
    operations > Change requests). A new row goes through change_create (audited). Rows are never
    deleted here, nor edited in the list (a list edit would have no reason)."""

    form = GuardedChangeForm
    list_editable = ()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def save_model(self, request, obj, form, change):
        from exchange.backoffice import changes

        data = form.cleaned_data
        reason = data.get("reason")
        if not change:
            names = [f.name for f in obj._meta.concrete_fields if f.name in data]
            created = changes.change_create(
                actor=request.user, model=type(obj), values={name: data[name] for name in names}, reason=reason
            )
            obj.pk = created.pk
            obj.refresh_from_db()  # the row the service wrote, which the admin then logs and links to
            return
        wanted = {name: data[name] for name in form.changed_data if name != "reason"}
        try:
            outcome = changes.change_submit(actor=request.user, obj=obj, changes=wanted, reason=reason)
        except changes.ChangeRefused as exc:
            request._change_refused = str(exc)
            return
        request._change_outcome = outcome
        obj.refresh_from_db()  # what is stored now: unchanged when the change waits for approval
