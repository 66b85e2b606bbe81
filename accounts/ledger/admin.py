"""Admin for the ledger: assets and limit tiers are edited; balances, postings, entries, the change
feed and check results are read-only; money moves only through the adjustment form (a service)."""

import uuid

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from accounts.ledger import services
from accounts.ledger.models import Asset, Balance, BalanceChange, Entry, LedgerCheckRun, ManualAdjustment, Posting
from accounts.models import LimitTier, TierLimit
from exchange.api.errors import InsufficientBalance


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Asset)
class AssetAdmin(admin.ModelAdmin):
    list_display = ("code", "name", "transfer_precision", "transfer_min_quantity", "is_fiat", "reference_price")
    search_fields = ("code", "name")

    def get_readonly_fields(self, request, obj=None):
        return ("code",) if obj else ()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


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
    # Made when the form is shown and sent back with it: the same form submitted twice posts once
    # (ledger.services.adjustment_create).
    request_id = forms.UUIDField(widget=forms.HiddenInput, required=False, initial=uuid.uuid4)

    class Meta:
        model = ManualAdjustment
        fields = ("account", "asset", "amount", "reason")

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


@admin.register(ManualAdjustment)
class ManualAdjustmentAdmin(admin.ModelAdmin):
    """Operators correct a balance here; each adjustment is a balanced posting against the equity
    account, with the reason and the operator recorded. Adjustments are never edited or deleted:
    a mistake is corrected by another adjustment."""

    form = AdjustmentForm
    list_display = ("created_at", "account", "asset", "amount", "reason", "created_by", "posting")
    list_filter = ("asset",)
    search_fields = ("account__email", "reason")
    raw_id_fields = ("account",)

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        created = services.adjustment_create(
            account=data["account"],
            asset=data["asset"],
            amount=data["amount"],
            reason=data["reason"],
            created_by=request.user,
            request_id=data.get("request_id"),
        )
        obj.pk = created.pk
        obj.refresh_from_db()  # the row the service wrote, which the admin then logs and links to

    def add_view(self, request, form_url="", extra_context=None):
        try:
            return super().add_view(request, form_url, extra_context)
        except InsufficientBalance:
            self.message_user(request, "Refused: the account's free balance is smaller than the debit.", messages.ERROR)
            from django.http import HttpResponseRedirect

            return HttpResponseRedirect(request.get_full_path())


class TierLimitInline(admin.TabularInline):
    model = TierLimit
    extra = 0


@admin.register(LimitTier)
class LimitTierAdmin(admin.ModelAdmin):
    list_display = ("name", "currency", "is_default")
    inlines = [TierLimitInline]
