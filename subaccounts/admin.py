"""Sub-account admin: the family's transfers, read-only (they are written only with their posting).
Sub-accounts themselves are users (accounts admin: freeze/unfreeze, keys)."""

from __future__ import annotations

from django.contrib import admin

from subaccounts.models import FundCollection, FundCollectionOutcome, SubAccountTransfer


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


class _ReadOnly:
    """Collection tasks and their outcomes are written only by the service (with their postings)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class FundCollectionOutcomeInline(_ReadOnly, admin.TabularInline):
    model = FundCollectionOutcome
    fields = ("sub", "status", "reason", "posting", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False


@admin.register(FundCollection)
class FundCollectionAdmin(_ReadOnly, admin.ModelAdmin):
    """A master's collection tasks, each with what it did per sub-account (read-only)."""

    list_display = ("id", "client_request_id", "master", "status", "attempts", "created_at", "finished_at")
    list_filter = ("status",)
    list_select_related = ("master",)
    search_fields = ("client_request_id", "master__email")
    date_hierarchy = "created_at"
    ordering = ("-id",)
    readonly_fields = (
        "master",
        "client_request_id",
        "remark",
        "status",
        "comment",
        "attempts",
        "created_at",
        "updated_at",
        "finished_at",
    )
    inlines = (FundCollectionOutcomeInline,)
