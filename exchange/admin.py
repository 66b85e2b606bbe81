from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone

from accounts.ledger.admin import ReadOnlyAdmin
from exchange import changes, services
from exchange.api import ratelimit
from exchange.backoffice import (
    ReasonActionForm,
    ReasonFieldAdmin,
    ReasonFormMixin,
    ThrottledAdminLoginForm,
    action_reason,
)
from exchange.models import BusinessStatus, ChangeRequest, RateLimitBan, StaffAction
from exchange.services import staff_action, summary

# Failed logins are counted per IP and per username; past the limits the login is refused.
admin.site.login_form = ThrottledAdminLoginForm


class BusinessStatusForm(ReasonFormMixin, forms.ModelForm):
    class Meta:
        model = BusinessStatus
        fields = ("is_on",)


@admin.register(BusinessStatus)
class BusinessStatusAdmin(ReasonFieldAdmin, admin.ModelAdmin):
    """Switched on its page or by the list's actions, with a reason (audited)."""

    form = BusinessStatusForm
    action_form = ReasonActionForm
    list_display = ("business_type", "is_on", "updated_at", "updated_by")
    readonly_fields = ("business_type", "updated_at", "updated_by")
    actions = ["switch_on", "switch_off"]

    def has_add_permission(self, request) -> bool:
        return False  # SPOT and CONVERT are seeded by a migration

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _set(self, request, row: BusinessStatus, is_on: bool, reason: str) -> BusinessStatus:
        before = summary(BusinessStatus.objects.get(pk=row.pk), ("business_type", "is_on"))
        with staff_action(
            actor=request.user, action="business_status.set", reason=reason, target=row, before=before
        ) as draft:
            stored = services.business_status_set(business_type=row.business_type, is_on=is_on, updated_by=request.user)
            draft.after = summary(stored, ("business_type", "is_on"))
        return stored

    def save_model(self, request, obj, form, change):
        stored = self._set(request, obj, obj.is_on, form.cleaned_data["reason"])
        obj.pk = stored.pk

    def _switch(self, request, queryset, is_on: bool) -> None:
        reason = action_reason(self, request)
        if reason is None:
            return
        for row in queryset:
            self._set(request, row, is_on, reason)
        self.message_user(request, f"{queryset.count()} business(es) switched {'on' if is_on else 'off'}.")

    @admin.action(description="Switch the selected businesses on", permissions=["change"])
    def switch_on(self, request, queryset):
        self._switch(request, queryset, True)

    @admin.action(description="Switch the selected businesses off", permissions=["change"])
    def switch_off(self, request, queryset):
        self._switch(request, queryset, False)


@admin.register(RateLimitBan)
class RateLimitBanAdmin(admin.ModelAdmin):
    list_display = (
        "ip",
        "offence",
        "duration_seconds",
        "created_at",
        "expires_at",
        "is_active",
        "lifted_at",
        "lifted_by",
    )
    list_filter = ("created_at", "lifted_at")
    search_fields = ("ip",)
    readonly_fields = [f.name for f in RateLimitBan._meta.fields]
    actions = ["lift_bans"]
    action_form = ReasonActionForm

    @admin.display(boolean=True, description="active")
    def is_active(self, ban: RateLimitBan) -> bool:
        return ban.lifted_at is None and ban.expires_at > timezone.now()

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Lift the selected bans now", permissions=["change"])
    def lift_bans(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        for ban in queryset:
            with staff_action(
                actor=request.user, action="ban.lift", reason=reason, target=ban, before=summary(ban)
            ) as draft:
                draft.after = summary(ratelimit.rate_limit_ban_lift(ban=ban, lifted_by=request.user))
        self.message_user(request, f"Lifted {queryset.count()} ban(s).", messages.SUCCESS)


@admin.register(StaffAction)
class StaffActionAdmin(ReadOnlyAdmin):
    """The audit trail: read-only for everyone (written only by exchange.services.staff_action)."""

    list_display = ("created_at", "actor", "action", "object_type", "object_id", "object_repr", "reason")
    list_filter = ("action", "object_type", "created_at")
    search_fields = ("actor__email", "object_id", "object_repr", "reason")
    list_select_related = ("actor",)
    readonly_fields = [f.name for f in StaffAction._meta.fields]
    date_hierarchy = "created_at"


class ChangeDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=(("approve", "approve"), ("cancel", "cancel")))
    reason = forms.CharField(max_length=255, required=False)


@admin.register(ChangeRequest)
class ChangeRequestAdmin(ReadOnlyAdmin):
    """Proposed changes of settings that matter to money (exchange/changes.py): read-only; on a
    proposed one's page another Administrator approves it (it is applied then) or cancels it; its
    proposer may cancel it. Every decision needs a reason and is audited."""

    list_display = ("id", "proposed_at", "action", "object_repr", "changes", "status", "proposed_by", "decided_by")
    list_filter = ("status", "action", "object_type")
    search_fields = ("object_repr", "reason", "proposed_by__email")
    list_select_related = ("proposed_by", "decided_by")
    readonly_fields = [f.name for f in ChangeRequest._meta.fields]

    def get_urls(self):
        return [
            path(
                "<int:pk>/decide/", self.admin_site.admin_view(self.decide_view), name="exchange_changerequest_decide"
            ),
            *super().get_urls(),
        ]

    def decide_view(self, request, pk: int):
        """POST only: approve (apply) or cancel a proposed change, with a reason."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        proposal = get_object_or_404(ChangeRequest, pk=pk)
        back = HttpResponseRedirect(reverse("admin:exchange_changerequest_change", args=[pk]))
        form = ChangeDecisionForm(request.POST)
        if not form.is_valid():
            self.message_user(request, "Choose to approve or to cancel.", messages.ERROR)
            return back
        decision, reason = form.cleaned_data["decision"], form.cleaned_data["reason"]
        if not request.user.has_perm(changes.APPROVE_PERMISSION) and proposal.proposed_by_id != request.user.pk:
            raise PermissionDenied
        try:
            if decision == "approve":
                changes.change_approve(request_id=pk, approved_by=request.user, reason=reason)
            else:
                changes.change_cancel(request_id=pk, cancelled_by=request.user, reason=reason)
        except (services.ReasonRequired, changes.ChangeRefused) as exc:
            self.message_user(request, f"Refused: {exc}", messages.ERROR)
        else:
            done = "approved and applied" if decision == "approve" else "cancelled"
            self.message_user(request, f"Change request #{pk} {done}.", messages.SUCCESS)
        return back

    def change_view(self, request, object_id, form_url="", extra_context=None):
        proposal = ChangeRequest.objects.filter(pk=object_id).first()
        extra_context = {
            **(extra_context or {}),
            "proposal": proposal,
            "may_approve": proposal is not None and changes.may_approve(request.user, proposal),
            "may_cancel": proposal is not None and changes.may_cancel(request.user, proposal),
            "is_proposer": proposal is not None and proposal.proposed_by_id == request.user.pk,
        }
        return super().change_view(request, object_id, form_url, extra_context)
