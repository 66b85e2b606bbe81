from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path

from accounts.ledger.errors import InsufficientBalance
from exchange.backoffice.toolkit import GuardedChangeAdmin
from wallet.models import Transfer, TransferFee
from wallet.transfers import services


@admin.register(TransferFee)
class TransferFeeAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """A fee lowered waits for a second Administrator; raised, it applies at once (audited)."""

    list_display = ("asset", "fee")


class ReversalForm(forms.Form):
    decision = forms.ChoiceField(
        choices=(("reverse", "reverse"), ("cancel", "cancel the request")),
        initial="reverse",
        required=False,
        widget=forms.HiddenInput,
    )
    reason = forms.CharField(max_length=255, help_text="Why (required): kept on the posting and in the audit trail.")


@admin.register(Transfer)
class TransferAdmin(admin.ModelAdmin):
    """Read-only: a transfer is undone only by a new, audited reversing posting, asked for by one
    Administrator and confirmed by another (wallet.transfers.services.transfer_reverse)."""

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
        "reversal_requested_by",
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
        """Ask for, confirm or cancel a reversal (wallet.transfers.services.transfer_reverse: above
        TRANSFER_REVERSAL_FOUR_EYES_ABOVE, 0 by default, a second Administrator confirms)."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        transfer = get_object_or_404(Transfer.objects.select_related("asset", "sender", "recipient"), pk=pk)
        form = ReversalForm(request.POST or None)
        if transfer.reversal_posting_id:
            self.message_user(request, "This transfer was already reversed.", messages.WARNING)
            return redirect("admin:wallet_transfer_change", pk)
        if request.method == "POST" and form.is_valid():
            decision, reason = form.cleaned_data["decision"] or "reverse", form.cleaned_data["reason"]
            try:
                if decision == "cancel":
                    services.transfer_reversal_cancel(transfer=transfer, cancelled_by=request.user, reason=reason)
                else:
                    done = services.transfer_reverse(transfer=transfer, reversed_by=request.user, reason=reason)
            except services.ReversalRefused as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
            except InsufficientBalance:
                self.message_user(request, "Refused: the recipient no longer holds the amount.", messages.ERROR)
            else:
                if decision == "cancel":
                    self.message_user(request, "Reversal request cancelled: nothing was posted.", messages.SUCCESS)
                elif done.reversal_posting_id is None:
                    self.message_user(
                        request,
                        "Reversal asked for: no money has moved. Another Administrator must confirm it.",
                        messages.WARNING,
                    )
                else:
                    self.message_user(request, "Transfer reversed by a new posting.", messages.SUCCESS)
            return redirect("admin:wallet_transfer_change", pk)
        context = {
            **self.admin_site.each_context(request),
            "form": form,
            "transfer": transfer,
            "requested": transfer.reversal_requested_by_id is not None,
            "is_requester": transfer.reversal_requested_by_id == request.user.pk,
            "needs_two": services.reversal_needs_two(transfer),
            "opts": self.model._meta,
            "title": f"Reverse transfer #{transfer.pk}",
        }
        return TemplateResponse(request, "admin/wallet/transfer/reverse.html", context)
