"""Business status and the gateway's ban rows in the admin: every change with a reason, audited."""

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from exchange.api.models import RateLimitBan
from exchange.backoffice.toolkit import ReasonActionForm, ReasonFieldAdmin, ReasonFormMixin, action_reason
from exchange.platform import services
from exchange.platform.models import BusinessStatus


class BusinessStatusForm(ReasonFormMixin, forms.ModelForm):
    class Meta:
        model = BusinessStatus
        fields = ("is_on",)


@admin.register(BusinessStatus)
class BusinessStatusAdmin(ReasonFieldAdmin, admin.ModelAdmin):
    """Switched on its page or by the list's actions, with a reason (audited)."""

    form = BusinessStatusForm
    action_form = ReasonActionForm
    list_display = ("business_type", "is_on", "updated_at", "updated_by")
    readonly_fields = ("business_type", "updated_at", "updated_by")
    actions = ["switch_on", "switch_off"]

    def has_add_permission(self, request) -> bool:
        return False  # SPOT and CONVERT are seeded by a migration

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _set(self, request, row: BusinessStatus, is_on: bool, reason: str) -> BusinessStatus:
        return services.business_status_switch(
            actor=request.user, business_type=row.business_type, is_on=is_on, reason=reason
        )

    def save_model(self, request, obj, form, change):
        stored = self._set(request, obj, obj.is_on, form.cleaned_data["reason"])
        obj.pk = stored.pk

    def _switch(self, request, queryset, is_on: bool) -> None:
        reason = action_reason(self, request)
        if reason is None:
            return
        for row in queryset:
            self._set(request, row, is_on, reason)
        self.message_user(request, f"{queryset.count()} business(es) switched {'on' if is_on else 'off'}.")

    @admin.action(description="Switch the selected businesses on", permissions=["change"])
    def switch_on(self, request, queryset):
        self._switch(request, queryset, True)

    @admin.action(description="Switch the selected businesses off", permissions=["change"])
    def switch_off(self, request, queryset):
        self._switch(request, queryset, False)


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
    action_form = ReasonActionForm

    @admin.display(boolean=True, description="active")
    def is_active(self, ban: RateLimitBan) -> bool:
        return ban.lifted_at is None and ban.expires_at > timezone.now()

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Lift the selected bans now", permissions=["change"])
    def lift_bans(self, request, queryset):
        reason = action_reason(self, request)
        if reason is None:
            return
        for ban in queryset:
            services.ban_lift(actor=request.user, ban=ban, reason=reason)
        self.message_user(request, f"Lifted {queryset.count()} ban(s).", messages.SUCCESS)
