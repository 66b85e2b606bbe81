from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class ConvertConfig(AppConfig):
    name = "convert"

    def ready(self) -> None:
        from convert import controls
        from convert.models import Market, Pair
        from exchange.runtime.ttlcache import invalidate_references

        controls.register()  # which staff changes wait for a second Administrator (exchange/backoffice/changes.py)
        # Cache invalidation: the enabled pairs, with their assets and markets, are cached per process
        # (convert/prices.py); any saved change to one reaches every process within
        # REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py; Pair's and Market's managers cover
        # updates; an asset's change is registered by its app, accounts/apps.py).
        for model in (Pair, Market):
            label = model._meta.label
            post_save.connect(invalidate_references, sender=model, dispatch_uid=f"reference-save-{label}")
            post_delete.connect(invalidate_references, sender=model, dispatch_uid=f"reference-delete-{label}")
