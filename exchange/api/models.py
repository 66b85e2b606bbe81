"""The gateway's one table: the 418 ban rows (written by exchange/api/ratelimit/bans.py).

The gateway is no Django app: the row carries the app label "exchange" (its table and migrations date
from exchange/models.py) and exchange/platform/models.py imports it so it is registered while the apps
load."""

from django.conf import settings
from django.db import models


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
        app_label = "exchange"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.ip} banned until {self.expires_at:%Y-%m-%d %H:%M:%S} (offence {self.offence})"


class UntimedSignature(models.Model):
    """The signature of a signed write sent without a timestamp (only where the endpoint allows
    one: the collect call), kept for ever from the first time the gateway verified it, whatever the
    request then ended in (exchange/api/untimed.py). No window ends such a signature's validity, so
    a request refused by a later check (a disabled key, the IP list, a limit) would otherwise run
    when replayed after the cause is lifted (issue 34, finding 8). In the database, not only in the
    rate-limit storage: it must outlive a Redis restart and the embedded process."""

    api_key = models.CharField(max_length=64)
    signature = models.CharField(max_length=64, help_text="Lower-case hex HMAC-SHA256.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "exchange"
        constraints = [
            models.UniqueConstraint(fields=["api_key", "signature"], name="untimed_signature_once"),
        ]

    def __str__(self) -> str:
        return f"{self.api_key}/{self.signature[:12]}…"
