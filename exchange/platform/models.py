"""The service's own small domain: whether each line of business is open. The app label stays
"exchange" (exchange/platform/apps.py)."""

from django.conf import settings
from django.db import models

# The gateway's ban rows are the gateway's (exchange/api/models.py); the back office's records
# (exchange/backoffice/models.py) and the dashboard's rollup (exchange/dashboard/models.py) are their
# packages'. All carry this app's label, so their tables and migrations stay where they were; this
# import registers the ban rows while the apps load (the other two packages are apps of their own).
from exchange.api.models import RateLimitBan, UntimedSignature  # noqa: F401


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
