from django.conf import settings
from django.db import models


class BusinessType(models.TextChoices):
    SPOT = "SPOT", "Spot"
    CONVERT = "CONVERT", "Convert"


class BusinessStatus(models.Model):
    """Whether a line of business is open; reported by GET /openapi/v1/check-sys-status."""

    business_type = models.CharField(max_length=16, choices=BusinessType.choices, unique=True)
    is_on = models.BooleanField(default=True, help_text="Off stops the business and shows 'off' to clients.")
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["business_type"]
        verbose_name_plural = "business statuses"

    def __str__(self) -> str:
        return f"{self.business_type}: {'on' if self.is_on else 'off'}"


class RateLimitBan(models.Model):
    """An IP banned (HTTP 418) for continuing after a 429. The request path reads the ban from the
    rate-limit storage; this row is the record operators see and lift."""

    ip = models.GenericIPAddressField(db_index=True)
    offence = models.PositiveIntegerField(help_text="1 for a first offence within the escalation period.")
    duration_seconds = models.PositiveIntegerField()
    reason = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField()
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.ip} banned until {self.expires_at:%Y-%m-%d %H:%M:%S} (offence {self.offence})"
