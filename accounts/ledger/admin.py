"""Admin for the ledger: assets and limit tiers are edited; balances, postings, entries, the change
feed and check results are read-only; money moves only through adjustments, proposed and confirmed
by two staff members (services, audited)."""

import uuid

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse

from accounts.ledger import services
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.models import (
    Asset,
    Balance,
    BalanceChange,
    Entry,
    LedgerCheckRun,
    ManualAdjustment,
    Posting,
)
from accounts.models import LimitTier, TierLimit
from exchange.backoffice.services import ReasonRequired
from exchange.backoffice.toolkit import GuardedChangeAdmin, ReadOnlyAdmin


@admin.register(Asset)
class AssetAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """A reference price lowered (and the other loosening changes of accounts/controls.py) waits for
    a second Administrator; every change needs a reason and is audited."""

    list_display = ("code", "name", "transfer_precision", "transfer_min_quantity", "is_fiat", "reference_price")
    search_fields = ("code", "name")

    def get_readonly_fields(self, request, obj=None):
        return ("code",) if obj else ()


@admin.register(Balance)
class BalanceAdmin(ReadOnlyAdmin):
    list_display = ("account", "asset", "free", "locked", "updated_at")
    list_filter = ("asset",)
    search_fields = ("account__email",)
    list_select_related = ("account", "asset")


class EntryInline(admin.TabularInline):
    model = Entry
    fields = ("account", "asset", "bucket", "side", "amount")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Posting)
class PostingAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "reference", "memo", "actor", "created_at")
    list_filter = ("kind", "created_at")
    search_fields = ("reference", "memo")
    inlines = [EntryInline]

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(BalanceChange)
class BalanceChangeAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "account",
        "asset",
        "kind",
        "seq",
        "delta_free",
        "delta_locked",
        "free_after",
        "locked_after",
        "created_at",
        "published_at",
    )
    list_filter = ("kind", "asset")
    search_fields = ("account__email",)


@admin.register(LedgerCheckRun)
class LedgerCheckRunAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "ok", "postings", "balances", "finished_at")
    list_filter = ("ok",)
    readonly_fields = ("started_at", "finished_at", "ok", "postings", "balances", "report")


class AdjustmentForm(forms.ModelForm):
    # Made when the form is shown and sent back with it: the same form submitted twice proposes
    # once (ledger.services.adjustment_propose).
    request_id = forms.UUIDField(widget=forms.HiddenInput, required=False, initial=uuid.uuid4)

    class Meta:
        model = ManualAdjustment
        fields = ("account", "asset", "amount", "reason")
        help_texts = {"reason": "Why (required): kept on the adjustment, its posting and the audit trail."}

    def clean_account(self):
        account = self.cleaned_data["account"]
        if account.system_role is not None:
            raise ValidationError("Adjustments are made to customer accounts, not to the service's own accounts.")
        return account

    def clean_amount(self):
        amount = self.cleaned_data["amount"]
        if amount == 0:
            raise ValidationError("An adjustment must move something.")
        return amount

    def validate_unique(self):
        """A request id seen before is a resend: the service returns the first proposal."""

    def clean_reason(self):
        reason = self.cleaned_data["reason"].strip()
        if not reason:
            raise ValidationError("A reason is required.")
        return reason


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=(("confirm", "confirm"), ("cancel", "cancel")))
    reason = forms.CharField(max_length=255, required=False)


@admin.register(ManualAdjustment)
class ManualAdjustmentAdmin(admin.ModelAdmin):
    """Four eyes (docs/operations.md): Treasury or an Administrator PROPOSES an adjustment here (no
    money moves); another staff member with "confirm manual adjustment" (Administrators) CONFIRMS
    it on its page, which posts it (a balanced posting against the equity account), or cancels it.
    The proposer cannot confirm. Every step needs a reason and is audited. Adjustments are never
    edited or deleted: a mistake is corrected by another adjustment."""

    form = AdjustmentForm
    list_display = ("id", "created_at", "account", "asset", "amount", "status", "reason", "created_by", "decided_by")
    list_filter = ("status", "asset")
    search_fields = ("account__email", "reason")
    raw_id_fields = ("account",)
    readonly_fields = ("status", "created_by", "created_at", "decided_by", "decided_at", "decision_reason", "posting")
    list_select_related = ("account", "asset", "created_by", "decided_by")

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        proposed = services.adjustment_propose(
            account=data["account"],
            asset=data["asset"],
            amount=data["amount"],
            reason=data["reason"],
            proposed_by=request.user,
            request_id=data.get("request_id"),
        )
        obj.pk = proposed.pk
        obj.refresh_from_db()  # the row the service wrote, which the admin then logs and links to

    def response_add(self, request, obj, post_url_continue=None):
        self.message_user(
            request,
            f"Adjustment #{obj.pk} proposed: no money has moved. Another staff member must confirm it.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:accounts_manualadjustment_change", args=[obj.pk]))

    def get_urls(self):
        return [
            path(
                "<int:pk>/decide/",
                self.admin_site.admin_view(self.decide_view),
                name="accounts_manualadjustment_decide",
            ),
            *super().get_urls(),
        ]

    def decide_view(self, request, pk: int):
        """POST only: confirm (post it) or cancel a proposed adjustment, with a reason."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        get_object_or_404(ManualAdjustment, pk=pk)
        form = DecisionForm(request.POST)
        back = HttpResponseRedirect(reverse("admin:accounts_manualadjustment_change", args=[pk]))
        if not form.is_valid():
            self.message_user(request, "Choose to confirm or to cancel.", messages.ERROR)
            return back
        decision, reason = form.cleaned_data["decision"], form.cleaned_data["reason"]
        # The service checks who may decide and records the decision; a staff member without the
        # permission gets its refusal (StaffNotPermitted, a PermissionDenied: 403).
        try:
            if decision == "confirm":
                decided = services.adjustment_confirm(adjustment_id=pk, confirmed_by=request.user, reason=reason)
            else:
                decided = services.adjustment_cancel(adjustment_id=pk, cancelled_by=request.user, reason=reason)
        except ReasonRequired as exc:
            self.message_user(request, str(exc), messages.ERROR)
        except services.AdjustmentRefused as exc:
            self.message_user(request, f"Refused: {exc}", messages.ERROR)
        except InsufficientBalance:
            self.message_user(request, "Refused: the account's free balance is smaller than the debit.", messages.ERROR)
        else:
            done = f"confirmed and posted (posting #{decided.posting_id})" if decision == "confirm" else "cancelled"
            self.message_user(request, f"Adjustment #{pk} {done}.", messages.SUCCESS)
        return back

    def change_view(self, request, object_id, form_url="", extra_context=None):
        adjustment = ManualAdjustment.objects.filter(pk=object_id).first()
        extra_context = {
            **(extra_context or {}),
            "adjustment": adjustment,
            "may_confirm": adjustment is not None and services.may_confirm(request.user, adjustment),
            "may_cancel": adjustment is not None and services.may_cancel(request.user, adjustment),
            "is_proposer": adjustment is not None and adjustment.created_by_id == request.user.pk,
        }
        return super().change_view(request, object_id, form_url, extra_context)


class TierLimitInline(admin.TabularInline):
    """Shown on the tier's page; changed on each limit's own page (audited, four eyes to raise)."""

    model = TierLimit
    extra = 0
    fields = ("period", "cash_in_limit", "cash_out_limit", "total_withdraw_limit")
    readonly_fields = fields
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(LimitTier)
class LimitTierAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    list_display = ("name", "currency", "is_default")
    inlines = [TierLimitInline]


@admin.register(TierLimit)
class TierLimitAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """Raising a limit waits for a second Administrator; lowering one applies at once (audited)."""

    list_display = ("tier", "period", "cash_in_limit", "cash_out_limit", "total_withdraw_limit")
    list_filter = ("tier", "period")
    list_select_related = ("tier",)
