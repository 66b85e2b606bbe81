"""Wallet admin: networks (with their enable switches), whitelist entries, deposits and
withdrawals. Actions call services; money never moves by editing a row."""

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from exchange.backoffice.toolkit import (
    GuardedChangeAdmin,
    GuardedChangeForm,
    ReasonActionForm,
    action_reason,
    submit_to_each,
)
from wallet import approvals, deposits, withdrawals
from wallet.models import Deposit, DepositStatus, Network, WhitelistAddress, Withdrawal, WithdrawalStage


@admin.register(Network)
class NetworkAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """Fees, minimums, maximums, confirmations and the withdrawal switch: a change that loosens one
    waits for a second Administrator (wallet/controls.py); every change needs a reason (audited)."""

    list_display = (
        "coin",
        "network",
        "name",
        "deposit_enable",
        "withdraw_enable",
        "min_confirm",
        "withdraw_fee",
        "withdraw_min",
        "withdraw_max",
    )
    list_filter = ("coin", "deposit_enable", "withdraw_enable")
    actions = ["withdrawals_off", "withdrawals_on", "deposits_off", "deposits_on"]
    action_form = ReasonActionForm

    def _switch(self, request, queryset, field: str, on: bool) -> None:
        submit_to_each(
            self,
            request,
            queryset,
            {field: on},
            done="{n} network(s) switched.",
            waits="switching withdrawals on waits for another Administrator's approval.",
        )

    @admin.action(description="Switch withdrawals off (at once)", permissions=["change"])
    def withdrawals_off(self, request, queryset):
        self._switch(request, queryset, "withdraw_enable", False)

    @admin.action(description="Switch withdrawals on (a second Administrator approves)", permissions=["change"])
    def withdrawals_on(self, request, queryset):
        self._switch(request, queryset, "withdraw_enable", True)

    @admin.action(description="Switch deposits off", permissions=["change"])
    def deposits_off(self, request, queryset):
        self._switch(request, queryset, "deposit_enable", False)

    @admin.action(description="Switch deposits on", permissions=["change"])
    def deposits_on(self, request, queryset):
        self._switch(request, queryset, "deposit_enable", True)


class WhitelistForm(GuardedChangeForm):
    """The entry's fields and a required reason; the address and memo formats are the model's
    (WhitelistAddress.clean), so the audited service checks them too."""

    class Meta:
        model = WhitelistAddress
        fields = ("account", "network", "address", "tag", "name")


@admin.register(WhitelistAddress)
class WhitelistAddressAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """Adding or changing an entry needs a reason and is audited (exchange.backoffice.changes, the
    rule in wallet/controls.py); removing one is the "Remove" action, with a reason, audited
    (wallet.withdrawals.whitelist_entry_remove). Never deleted or edited without one."""

    form = WhitelistForm
    list_display = ("account", "network", "address", "tag", "name", "created_at")
    list_filter = ("network",)
    search_fields = ("account__email", "address", "name")
    raw_id_fields = ("account",)
    actions = ["remove"]
    action_form = ReasonActionForm

    @admin.action(description="Remove the selected entries (with a reason, audited)", permissions=["change"])
    def remove(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        removed = 0
        for entry in queryset:
            try:
                withdrawals.whitelist_entry_remove(entry=entry, removed_by=request.user, reason=reason)
            except PermissionDenied as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                continue
            removed += 1
        self.message_user(
            request, f"Removed {removed} whitelist entr{'y' if removed == 1 else 'ies'}.", messages.SUCCESS
        )


class TravelRuleForm(forms.Form):
    originator_name = forms.CharField(max_length=200)
    originator_address = forms.CharField(max_length=300, required=False)
    originator_vasp = forms.CharField(max_length=200, required=False, label="Originating VASP")
    reason = forms.CharField(
        max_length=500, help_text="Where the data comes from (required): kept in the audit trail with your name."
    )


@admin.register(Deposit)
class DepositAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "account",
        "network",
        "amount",
        "status",
        "confirmations",
        "tx_id",
        "inserted_at",
        "credited_at",
    )
    list_filter = ("status", "network", "inserted_at")
    search_fields = ("account__email", "tx_id", "address")
    readonly_fields = [f.name for f in Deposit._meta.fields if f.name != "travel_rule_data"] + ["travel_rule_data_view"]
    exclude = ("travel_rule_data",)
    actions = ["recheck"]
    action_form = ReasonActionForm

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="travel-rule data")
    def travel_rule_data_view(self, obj: Deposit) -> str:
        return json.dumps(obj.travel_rule_data, indent=1) if obj.travel_rule_data else "-"

    def get_urls(self):
        from django.urls import path

        return [
            path(
                "<int:pk>/travel-rule/",
                self.admin_site.admin_view(self.travel_rule_view),
                name="wallet_deposit_travel_rule",
            ),
            *super().get_urls(),
        ]

    def travel_rule_view(self, request, pk: int):
        from django.shortcuts import get_object_or_404, redirect
        from django.template.response import TemplateResponse

        if not self.has_change_permission(request):
            raise PermissionDenied
        deposit = get_object_or_404(Deposit, pk=pk)
        form = TravelRuleForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = dict(form.cleaned_data)
            reason = data.pop("reason")
            try:
                deposits.deposit_fill_travel_rule(deposit=deposit, data=data, filled_by=request.user, reason=reason)
            except (ValueError, PermissionDenied) as exc:  # no reason or permission, not held, empty
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, "Travel-rule data saved; the deposit continues.", messages.SUCCESS)
            return redirect("admin:wallet_deposit_change", pk)
        context = {
            **self.admin_site.each_context(request),
            "form": form,
            "deposit": deposit,
            "opts": self.model._meta,
            "title": f"Travel-rule data for deposit #{deposit.pk}",
        }
        return TemplateResponse(request, "admin/wallet/deposit/travel_rule.html", context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        deposit = Deposit.objects.filter(pk=object_id).first()
        extra_context = {
            **(extra_context or {}),
            "needs_travel_rule": deposit is not None and deposit.status == DepositStatus.NEED_FILL_DATA,
        }
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.action(description="Check the chain again for the selected deposits", permissions=["change"])
    def recheck(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        deposits.deposits_recheck(checked_by=request.user, reason=reason)
        self.message_user(request, "Chain scanned.", messages.SUCCESS)


@admin.register(Withdrawal)
class WithdrawalAdmin(admin.ModelAdmin):
    """Approve, reject or retry by the list's actions, with a reason (audited). Who may approve and
    when an approval takes two staff members is wallet/approvals.py; these actions only call it and
    show what it did."""

    list_display = (
        "id",
        "account",
        "network",
        "amount",
        "fee",
        "stage",
        "tx_id",
        "applied_at",
        "first_approved_by",
        "decided_by",
    )
    list_filter = ("stage", "network", "applied_at")
    search_fields = ("account__email", "tx_id", "address", "withdraw_order_id")
    readonly_fields = [f.name for f in Withdrawal._meta.fields]
    actions = ["approve", "reject", "retry"]
    action_form = ReasonActionForm

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Approve the selected withdrawals (they are sent)", permissions=["change"])
    def approve(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        sent = waiting = 0
        for withdrawal in queryset.filter(stage=WithdrawalStage.AWAITING_APPROVAL):
            try:
                done = approvals.withdrawal_approve(withdrawal=withdrawal, approved_by=request.user, reason=reason)
            except (ValueError, PermissionDenied) as exc:  # no permission, the account may not send, or four eyes
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                continue
            if done.stage == WithdrawalStage.AWAITING_APPROVAL:
                waiting += 1
            else:
                sent += 1
        self.message_user(request, f"Approved {sent} withdrawal(s).", messages.SUCCESS)
        if waiting:
            self.message_user(
                request,
                f"{waiting} withdrawal(s) above the four-eyes value (alone, or with the customer's other "
                "withdrawals of the last 24 hours) now wait for a second approver (not you).",
                messages.WARNING,
            )

    @admin.action(description="Reject the selected withdrawals (funds return to the account)", permissions=["change"])
    def reject(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        rejected = 0
        for withdrawal in queryset.filter(stage__in=[WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED]):
            try:
                approvals.withdrawal_reject(withdrawal=withdrawal, rejected_by=request.user, reason=reason)
            except PermissionDenied as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                continue
            rejected += 1
        self.message_user(request, f"Rejected {rejected} withdrawal(s).", messages.SUCCESS)

    @admin.action(description="Retry the selected stuck withdrawals", permissions=["change"])
    def retry(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        handed = 0
        for withdrawal in queryset.filter(stage__in=approvals.RETRY_STAGES):
            try:
                handed += approvals.withdrawal_retry_by_staff(
                    withdrawal=withdrawal, retried_by=request.user, reason=reason
                )
            except PermissionDenied as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                return
        self.message_user(request, f"Handed {handed} withdrawal(s) to a worker again.", messages.SUCCESS)


from wallet.transfers import admin as transfer_admin  # noqa: E402,F401 - registers the transfers' admin pages
