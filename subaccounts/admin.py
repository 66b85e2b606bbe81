"""Sub-account admin: the family's transfers, read-only (they are written only with their posting).
Sub-accounts themselves are users (accounts admin: freeze/unfreeze, keys)."""

from __future__ import annotations

from django.contrib import admin

from subaccounts.models import SubAccountTransfer


@admin.register(SubAccountTransfer)
class SubAccountTransferAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "client_tran_id",
        "master",
        "from_account",
        "to_account",
        "asset",
        "amount",
        "kind",
        "status",
        "created_at",
    )
    list_filter = ("kind", "status", "asset")
    list_select_related = ("master", "from_account", "to_account", "asset")
    search_fields = ("client_tran_id", "master__email", "from_account__email", "to_account__email")
    date_hierarchy = "created_at"
    ordering = ("-id",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
