"""Sub-account admin: the family's transfers and the masters' fund collections, read-only (they
are written only by their services, with their postings). Sub-accounts themselves are users
(accounts admin: freeze/unfreeze, keys)."""

from __future__ import annotations

from django.contrib import admin

from exchange.backoffice.toolkit import ReadOnlyAdmin, ReadOnlyTabularInline
from subaccounts.models import FundCollection, FundCollectionOutcome, SubAccountTransfer


@admin.register(SubAccountTransfer)
class SubAccountTransferAdmin(ReadOnlyAdmin):
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


class FundCollectionOutcomeInline(ReadOnlyTabularInline):
    model = FundCollectionOutcome
    fields = ("sub", "status", "reason", "posting", "created_at")
    readonly_fields = fields
    show_change_link = False


@admin.register(FundCollection)
class FundCollectionAdmin(ReadOnlyAdmin):
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
