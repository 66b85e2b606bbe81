from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_delete, post_save


class WalletConfig(AppConfig):
    name = "wallet"

    def ready(self) -> None:
        from exchange.runtime.ttlcache import invalidate_references
        from wallet import approvals, controls
        from wallet.models import TransferFee

        # The approval thresholds must make sense together, or no process starts (wallet/approvals.py).
        checks.register(approvals.check_thresholds)
        controls.register()  # which staff changes wait for a second Administrator (exchange/backoffice/changes.py)
        # Loading the tasks hands the withdrawal task to wallet/settlement.py (set_worker).
        from wallet import tasks  # noqa: F401

        # The transfer fees cached per process (wallet/transfers/services.py): any saved change reaches
        # every process within REFERENCE_REVOCATION_SECONDS (exchange/runtime/ttlcache.py; TransferFee's
        # manager covers queryset writes).
        post_save.connect(invalidate_references, sender=TransferFee, dispatch_uid="reference-save-wallet.TransferFee")
        post_delete.connect(
            invalidate_references, sender=TransferFee, dispatch_uid="reference-delete-wallet.TransferFee"
        )
