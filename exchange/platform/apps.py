from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


class PlatformConfig(AppConfig):
    """The service's own small domain (business status, the general endpoints). Its label stays
    "exchange": the tables, content types, permissions and recorded migrations of every model
    labelled so (this app's, the gateway's ban rows, the back office's records, the dashboard's
    rollup) keep their names."""

    name = "exchange.platform"
    label = "exchange"
    verbose_name = "Service operations"

    def ready(self) -> None:
        from exchange.platform.models import BusinessStatus
        from exchange.platform.services import business_status_seed
        from exchange.runtime.ttlcache import invalidate_references

        post_migrate.connect(business_status_seed, sender=self, dispatch_uid="exchange.business_status_seed")
        # The per-process cache of reference data (exchange/runtime/ttlcache.py) is cleared by the app
        # that owns each cached model, in its own ready(): here the business status (business_is_on).
        post_save.connect(invalidate_references, sender=BusinessStatus, dispatch_uid="reference-save-business")
        post_delete.connect(invalidate_references, sender=BusinessStatus, dispatch_uid="reference-delete-business")
