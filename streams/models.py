from django.conf import settings
from django.db import models


class ListenKey(models.Model):
    """The record of a listenKey (for operators and the hourly creation limit). Whether a key is
    alive is decided by the listenKey store (Redis with a TTL in the full stack, see store.py)."""

    key = models.CharField(max_length=64, unique=True)
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="listen_keys")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField(help_text="As of the last keepalive.")
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.key[:12]}… of {self.account_id}"
