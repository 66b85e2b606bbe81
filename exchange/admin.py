from django.contrib import admin, messages
from django.utils import timezone

from exchange import services
from exchange.api import ratelimit
from exchange.models import BusinessStatus, RateLimitBan


@admin.register(BusinessStatus)
class BusinessStatusAdmin(admin.ModelAdmin):
    list_display = ("business_type", "is_on", "updated_at", "updated_by")
    list_editable = ("is_on",)
    readonly_fields = ("business_type", "updated_at", "updated_by")

    def has_add_permission(self, request) -> bool:
        return False  # SPOT and CONVERT are seeded by a migration

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change):
        stored = services.business_status_set(business_type=obj.business_type, is_on=obj.is_on, updated_by=request.user)
        obj.pk = stored.pk


@admin.register(RateLimitBan)
class RateLimitBanAdmin(admin.ModelAdmin):
    list_display = (
        "ip",
        "offence",
        "duration_seconds",
        "created_at",
        "expires_at",
        "is_active",
        "lifted_at",
        "lifted_by",
    )
    list_filter = ("created_at", "lifted_at")
    search_fields = ("ip",)
    readonly_fields = [f.name for f in RateLimitBan._meta.fields]
    actions = ["lift_bans"]

    @admin.display(boolean=True, description="active")
    def is_active(self, ban: RateLimitBan) -> bool:
        return ban.lifted_at is None and ban.expires_at > timezone.now()

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Lift the selected bans now", permissions=["change"])
    def lift_bans(self, request, queryset):
        for ban in queryset:
            ratelimit.rate_limit_ban_lift(ban=ban, lifted_by=request.user)
        self.message_user(request, f"Lifted {queryset.count()} ban(s).", messages.SUCCESS)
