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


class ListenKeyHolder(models.Model):
    """An API key that was handed a listenKey: POST creates the key for it, or hands it the account's
    live key. Disabling or deleting any holder closes the listenKey (streams/apps.py). The API key is
    kept as its text, not a foreign key, so the row outlives a deleted key until it is acted on."""

    listen_key = models.ForeignKey(ListenKey, on_delete=models.CASCADE, to_field="key", related_name="holders")
    api_key = models.CharField(max_length=64, db_index=True, help_text="accounts.ApiKey.key")
    handed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["listen_key", "api_key"], name="one_row_per_listen_key_holder")]

    def __str__(self) -> str:
        return f"{self.api_key[:8]}… holds {self.listen_key_id[:12]}…"
