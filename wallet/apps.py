from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_delete, post_save


class WalletConfig(AppConfig):
    name = "wallet"

    def ready(self) -> None:
        from exchange.runtime.ttlcache import clear_all
        from wallet import approvals, controls
        from wallet.models import TransferFee

        # The approval thresholds must make sense together, or no process starts (wallet/approvals.py).
        checks.register(approvals.check_thresholds)
        controls.register()  # which staff changes wait for a second Administrator (exchange/backoffice/changes.py)
        # Loading the tasks hands the withdrawal task to wallet/settlement.py (set_worker).
        from wallet import tasks  # noqa: F401

        # Reference data cached per process (exchange/runtime/ttlcache.py): a save here clears it at once.
        label = "wallet.TransferFee"
        post_save.connect(clear_all, sender=TransferFee, dispatch_uid=f"ttlcache-save-{label}")
        post_delete.connect(clear_all, sender=TransferFee, dispatch_uid=f"ttlcache-delete-{label}")
