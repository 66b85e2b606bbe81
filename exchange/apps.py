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
        # The per-process cache of reference data (exchange/ttlcache.py) is cleared by the app that
        # owns each cached model, in its own ready().
