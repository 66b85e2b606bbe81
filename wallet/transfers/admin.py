from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path

from accounts.ledger.errors import InsufficientBalance
from exchange.backoffice.services import staff_action, summary
from exchange.backoffice.toolkit import GuardedChangeAdmin
from wallet.models import Transfer, TransferFee
from wallet.transfers import services


@admin.register(TransferFee)
class TransferFeeAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """A fee lowered waits for a second Administrator; raised, it applies at once (audited)."""

    list_display = ("asset", "fee")


class ReversalForm(forms.Form):
    reason = forms.CharField(max_length=255, help_text="Recorded on the reversing posting.")


@admin.register(Transfer)
class TransferAdmin(admin.ModelAdmin):
    """Read-only: a transfer is undone only by a new, audited reversing posting."""

    list_display = (
        "id",
        "sender",
        "recipient",
        "asset",
        "amount",
        "fee",
        "client_transfer_id",
        "status",
        "created_at",
        "reversed_by",
    )
    list_filter = ("asset", "api_version", "created_at")
    search_fields = ("sender__email", "recipient__email", "client_transfer_id", "target_address")
    readonly_fields = [f.name for f in Transfer._meta.fields]
    list_select_related = ("sender", "recipient", "asset")

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        return [
            path("<int:pk>/reverse/", self.admin_site.admin_view(self.reverse_view), name="wallet_transfer_reverse"),
            *super().get_urls(),
        ]

    def reverse_view(self, request, pk: int):
        from django.core.exceptions import PermissionDenied
        from django.shortcuts import get_object_or_404

        if not self.has_change_permission(request):
            raise PermissionDenied
        transfer = get_object_or_404(Transfer, pk=pk)
        form = ReversalForm(request.POST or None)
        if transfer.reversal_posting_id:
            self.message_user(request, "This transfer was already reversed.", messages.WARNING)
            return redirect("admin:wallet_transfer_change", pk)
        if request.method == "POST" and form.is_valid():
            reason = form.cleaned_data["reason"]
            try:
                with staff_action(
                    actor=request.user,
                    action="transfer.reverse",
                    reason=reason,
                    target=transfer,
                    before=summary(transfer),
                ) as draft:
                    draft.after = summary(
                        services.transfer_reverse(transfer=transfer, reversed_by=request.user, reason=reason)
                    )
            except InsufficientBalance:
                self.message_user(request, "Refused: the recipient no longer holds the amount.", messages.ERROR)
            else:
                self.message_user(request, "Transfer reversed by a new posting.", messages.SUCCESS)
            return redirect("admin:wallet_transfer_change", pk)
        context = {
            **self.admin_site.each_context(request),
            "form": form,
            "transfer": transfer,
            "opts": self.model._meta,
            "title": f"Reverse transfer #{transfer.pk}",
        }
        return TemplateResponse(request, "admin/wallet/transfer/reverse.html", context)
