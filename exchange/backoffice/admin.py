"""The back office's own records in the admin (the audit trail, the change requests with their
approve and cancel buttons) and the admin's throttled login."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse

from exchange.backoffice import changes, services
from exchange.backoffice.models import ChangeRequest, StaffAction
from exchange.backoffice.toolkit import ReadOnlyAdmin, ThrottledAdminLoginForm

# Failed logins are counted per IP and per username; past the limits the login is refused.
admin.site.login_form = ThrottledAdminLoginForm


@admin.register(StaffAction)
class StaffActionAdmin(ReadOnlyAdmin):
    """The audit trail: read-only for everyone (written only by exchange.backoffice.services.staff_action)."""

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
    """Proposed changes of settings that matter to money (exchange/backoffice/changes.py): read-only; on a
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
        if not request.user.has_perm(changes.APPROVE_PERMISSION) and proposal.proposed_by_id != request.user.pk:
            raise PermissionDenied  # before anything else: a stranger learns nothing from the form's checks
        form = ChangeDecisionForm(request.POST)
        if not form.is_valid():
            self.message_user(request, "Choose to approve or to cancel.", messages.ERROR)
            return back
        decision, reason = form.cleaned_data["decision"], form.cleaned_data["reason"]
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
