from functools import partial

from django.apps import AppConfig
from django.db import transaction
from django.db.models.signals import post_delete, post_save


def _revoke_after_commit(using, revocation: str, **arguments) -> None:
    from streams import services

    transaction.on_commit(partial(getattr(services, revocation), **arguments), using=using)


def _api_key_saved(sender, instance, raw=False, using=None, **kwargs) -> None:
    from accounts.models import ApiKeyStatus

    if not raw and instance.status != ApiKeyStatus.ENABLE:
        _revoke_after_commit(using, "listen_keys_revoke_for_api_key", api_key=instance.key)


def _api_key_deleted(sender, instance, using=None, **kwargs) -> None:
    _revoke_after_commit(using, "listen_keys_revoke_for_api_key", api_key=instance.key)


def _account_saved(sender, instance, raw=False, using=None, **kwargs) -> None:
    if not raw and (not instance.is_active or instance.is_frozen):
        _revoke_after_commit(using, "listen_keys_revoke_for_account", account_id=instance.pk)


class StreamsConfig(AppConfig):
    name = "streams"
    verbose_name = "User data streams"

    def ready(self) -> None:
        from accounts.ledger.posting import after_commit_listeners
        from accounts.models import ApiKey, User
        from streams.relay import publish_posting

        # The ledger tells its listeners after commit; streams listens (the ledger never imports streams).
        if publish_posting not in after_commit_listeners:
            after_commit_listeners.append(publish_posting)

        # Revocation, not business logic: whatever disables or deletes an API key, or deactivates or
        # freezes an account (admin, services, shell), closes the listenKeys it held and their
        # connections in every process, after the change commits (accounts never imports streams).
        # Accounts themselves are never deleted (the ledger protects them).
        post_save.connect(_api_key_saved, sender=ApiKey, dispatch_uid="streams-api-key-saved")
        post_delete.connect(_api_key_deleted, sender=ApiKey, dispatch_uid="streams-api-key-deleted")
        post_save.connect(_account_saved, sender=User, dispatch_uid="streams-account-saved")
