from django.apps import AppConfig, apps
from django.db.models.signals import post_delete, post_migrate, post_save


class ExchangeConfig(AppConfig):
    name = "exchange"
    verbose_name = "Service operations"

    def ready(self) -> None:
        from exchange.models import BusinessStatus
        from exchange.roles import sync_roles
        from exchange.services import business_status_seed
        from exchange.ttlcache import invalidate_references

        # Once per migrate (or test database flush), after the last app's permissions exist: on the
        # last app's signal, not on every app's (ten runs of the same idempotent writes took a
        # second of each transactional test's flush).
        with_models = [config for config in apps.get_app_configs() if config.models_module is not None]
        post_migrate.connect(sync_roles, sender=with_models[-1], dispatch_uid="exchange.sync_roles")
        post_migrate.connect(business_status_seed, sender=self, dispatch_uid="exchange.business_status_seed")
        # The per-process cache of reference data (exchange/ttlcache.py) is cleared by the app that
        # owns each cached model, in its own ready(): here the business status (business_is_on).
        post_save.connect(invalidate_references, sender=BusinessStatus, dispatch_uid="reference-save-business")
        post_delete.connect(invalidate_references, sender=BusinessStatus, dispatch_uid="reference-delete-business")
