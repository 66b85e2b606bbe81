"""Wallet admin: networks (with their enable switches), whitelist entries, deposits and
withdrawals. Actions call services; money never moves by editing a row."""

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from wallet import services
from wallet.models import Deposit, DepositStatus, Network, WhitelistAddress, Withdrawal, WithdrawalStage


@admin.register(Network)
class NetworkAdmin(admin.ModelAdmin):
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
    list_editable = ("deposit_enable", "withdraw_enable")
    list_filter = ("coin", "deposit_enable", "withdraw_enable")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class WhitelistForm(forms.ModelForm):
    class Meta:
        model = WhitelistAddress
        fields = ("account", "network", "address", "tag", "name")

    def clean(self):
        import re

        data = super().clean()
        network, address, tag = data.get("network"), data.get("address", ""), data.get("tag", "")
        if network is not None and address and not re.fullmatch(network.address_regex, address):
            raise ValidationError({"address": f"Not an address of {network} ({network.address_regex})."})
        if network is not None and tag and network.memo_regex and not re.fullmatch(network.memo_regex, tag):
            raise ValidationError({"tag": f"Not a memo of {network} ({network.memo_regex})."})
        if network is not None and tag and not network.memo_regex:
            raise ValidationError({"tag": f"{network} has no memo/tag."})
        return data


@admin.register(WhitelistAddress)
class WhitelistAddressAdmin(admin.ModelAdmin):
    form = WhitelistForm
    list_display = ("account", "network", "address", "tag", "name", "created_at")
    list_filter = ("network",)
    search_fields = ("account__email", "address", "name")
    raw_id_fields = ("account",)


class TravelRuleForm(forms.Form):
    originator_name = forms.CharField(max_length=200)
    originator_address = forms.CharField(max_length=300, required=False)
    originator_vasp = forms.CharField(max_length=200, required=False, label="Originating VASP")


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
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        deposit = get_object_or_404(Deposit, pk=pk)
        form = TravelRuleForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                services.deposit_fill_travel_rule(deposit=deposit, data=form.cleaned_data, filled_by=request.user)
            except ValueError as exc:
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
        services.deposits_scan()
        self.message_user(request, "Chain scanned.", messages.SUCCESS)


@admin.register(Withdrawal)
class WithdrawalAdmin(admin.ModelAdmin):
    list_display = ("id", "account", "network", "amount", "fee", "stage", "tx_id", "applied_at", "decided_by")
    list_filter = ("stage", "network", "applied_at")
    search_fields = ("account__email", "tx_id", "address", "withdraw_order_id")
    readonly_fields = [f.name for f in Withdrawal._meta.fields]
    actions = ["approve", "reject", "retry"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Approve the selected withdrawals (they are sent)", permissions=["change"])
    def approve(self, request, queryset):
        done = 0
        for withdrawal in queryset.filter(stage=WithdrawalStage.AWAITING_APPROVAL):
            try:
                services.withdrawal_approve(withdrawal=withdrawal, approved_by=request.user)
                done += 1
            except ValueError as exc:  # its account may not send funds
                self.message_user(request, str(exc), messages.ERROR)
        self.message_user(request, f"Approved {done} withdrawal(s).", messages.SUCCESS)

    @admin.action(description="Reject the selected withdrawals (funds return to the account)", permissions=["change"])
    def reject(self, request, queryset):
        done = [
            services.withdrawal_reject(withdrawal=w, rejected_by=request.user)
            for w in queryset.filter(stage__in=[WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED])
        ]
        self.message_user(request, f"Rejected {len(done)} withdrawal(s).", messages.SUCCESS)

    @admin.action(description="Retry the selected stuck withdrawals", permissions=["change"])
    def retry(self, request, queryset):
        stuck = list(queryset.filter(stage__in=[WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING]))
        for withdrawal in stuck:
            services.withdrawal_retry(withdrawal=withdrawal)
        self.message_user(request, f"Handed {len(stuck)} withdrawal(s) to a worker again.", messages.SUCCESS)


from wallet.transfers import admin as transfer_admin  # noqa: E402,F401 - registers the transfers' admin pages
