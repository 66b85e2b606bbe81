from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate


class BackofficeConfig(AppConfig):
    """The back office's staff tools: the audit trail, four-eyes changes, the staff roles, the admin's
    safety and building blocks. Its records keep the label "exchange" (exchange/backoffice/models.py)."""

    name = "exchange.backoffice"
    label = "backoffice"
    verbose_name = "Back office"

    def ready(self) -> None:
        from exchange.backoffice.roles import sync_roles

        # Once per migrate (or test database flush), after the last app's permissions exist: on the
        # last app's signal, not on every app's (ten runs of the same idempotent writes took a
        # second of each transactional test's flush).
        with_models = [config for config in apps.get_app_configs() if config.models_module is not None]
        post_migrate.connect(sync_roles, sender=with_models[-1], dispatch_uid="exchange.sync_roles")
