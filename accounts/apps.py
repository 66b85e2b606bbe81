from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


def _invalidate_keyring(sender, instance, **kwargs) -> None:
    from accounts.keyring import keyrings

    keyrings.invalidate(instance.pk if sender.__name__ == "User" else instance.user_id)


def _open_ledger_account(sender, instance, created, **kwargs) -> None:
    if created:
        from accounts.models import LedgerAccount

        LedgerAccount.objects.get_or_create(user=instance)


def _mark_written(result) -> None:
    from exchange.runtime import replicas

    replicas.mark_written(balance.account_id for balance in result.balances)


def _seed(**kwargs) -> None:
    from accounts.seed import seed_defaults

    seed_defaults()


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts and API keys"

    def ready(self) -> None:
        from accounts import controls
        from accounts.keyring import keyrings
        from accounts.ledger import errors as ledger_errors
        from accounts.ledger.posting import after_commit_listeners
        from accounts.models import ApiKey, Asset, LimitTier, TierLimit, User
        from exchange.api import auth, errors
        from exchange.runtime.ttlcache import invalidate_references

        controls.register()  # which staff changes wait for a second Administrator (exchange/backoffice/changes.py)
        # The ledger's refusals are its own; the gateway answers them with its code table's rows.
        errors.answer_as(ledger_errors.InsufficientBalance, errors.InsufficientBalance)
        errors.answer_as(ledger_errors.AccountMayNotSend, errors.NoPermission, keep_message=True)
        # The gateway imports no app: it finds API keys in the store registered here.
        auth.register_key_store(keyrings)

        # Cache invalidation, not business logic: any saved change to a key or an account (admin,
        # services, shell) evicts the gateway's cached keyring of that account.
        # Every account gets its ledger row when it is created, so postings never have to insert one
        # while holding other accounts' locks.
        post_save.connect(_open_ledger_account, sender=User, dispatch_uid="ledger-account-open")
        # The default limit tier and the system accounts exist after every migrate (and after a
        # test database flush, which re-sends post_migrate).
        post_migrate.connect(_seed, sender=self, dispatch_uid="accounts-seed")
        for model in (ApiKey, User):
            post_save.connect(_invalidate_keyring, sender=model, dispatch_uid=f"keyring-save-{model.__name__}")
            post_delete.connect(_invalidate_keyring, sender=model, dispatch_uid=f"keyring-delete-{model.__name__}")
        # The replicas' sticky rule (exchange/runtime/replicas.py): an account that posted reads its
        # history on the primary for a while. Does nothing without a replica configured.
        if _mark_written not in after_commit_listeners:
            after_commit_listeners.append(_mark_written)
        # Reference data cached per process (assets by code, limit tiers, and convert's pairs with
        # their assets): any saved change reaches every process within REFERENCE_REVOCATION_SECONDS
        # (exchange/runtime/ttlcache.py; the models' managers cover queryset writes).
        for model in (Asset, LimitTier, TierLimit):
            label = model._meta.label
            post_save.connect(invalidate_references, sender=model, dispatch_uid=f"reference-save-{label}")
            post_delete.connect(invalidate_references, sender=model, dispatch_uid=f"reference-delete-{label}")
