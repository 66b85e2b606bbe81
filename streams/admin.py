from django.contrib import admin, messages

from streams import services
from streams.models import ListenKey
from streams.services import STORE_ERRORS
from streams.store import store


@admin.register(ListenKey)
class ListenKeyAdmin(admin.ModelAdmin):
    list_display = ("short_key", "account", "created_at", "expires_at", "closed_at", "alive")
    search_fields = ("account__email", "key")
    list_filter = ("closed_at",)
    readonly_fields = ("key", "account", "created_at", "expires_at", "closed_at", "api_keys")
    actions = ["close_keys"]

    @admin.display(description="key")
    def short_key(self, obj: ListenKey) -> str:
        return f"{obj.key[:12]}…"

    @admin.display(boolean=True)
    def alive(self, obj: ListenKey) -> bool | None:
        try:
            return store().owner(obj.key) == obj.account_id
        except STORE_ERRORS:
            return None  # unknown while Redis is unreachable

    @admin.display(description="API keys that were handed it (disabling one closes it)")
    def api_keys(self, obj: ListenKey) -> str:
        return ", ".join(f"{key[:8]}…" for key in obj.holders.values_list("api_key", flat=True)) or "-"

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Close the selected listenKeys (their streams disconnect)", permissions=["change"])
    def close_keys(self, request, queryset):
        for key in queryset:
            services.listen_key_revoke(key=key.key)
        self.message_user(request, f"Closed {queryset.count()} listenKey(s).", messages.SUCCESS)
