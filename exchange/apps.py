from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ExchangeConfig(AppConfig):
    name = "exchange"
    verbose_name = "Service operations"

    def ready(self) -> None:
        from exchange.roles import sync_roles
        from exchange.services import business_status_seed

        # After the last app's permissions exist; idempotent.
        post_migrate.connect(sync_roles, dispatch_uid="exchange.sync_roles")
        post_migrate.connect(business_status_seed, sender=self, dispatch_uid="exchange.business_status_seed")

        # Reference data cached per process (exchange/ttlcache.py): a save here clears it at once.
        from django.apps import apps
        from django.db.models.signals import post_delete, post_save

        from exchange.ttlcache import clear_all

        for label in ("accounts.Asset", "accounts.LimitTier", "accounts.TierLimit", "wallet.TransferFee"):
            model = apps.get_model(label)
            post_save.connect(clear_all, sender=model, dispatch_uid=f"ttlcache-save-{label}")
            post_delete.connect(clear_all, sender=model, dispatch_uid=f"ttlcache-delete-{label}")
