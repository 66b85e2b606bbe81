"""Sub-accounts: a sub-account is an accounts.User with `master` set (and `is_virtual` when created
through the API); this app owns the transfers between a master and its sub-accounts. docs/subaccounts.md."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from accounts.ledger.models import AmountField


class TransferKind(models.TextChoices):
    UNIVERSAL = "UNIVERSAL", "Universal transfer (master's key)"
    SUB_TO_MASTER = "SUB_TO_MASTER", "Sub-account to master (sub-account's key)"


class TransferStatus(models.TextChoices):
    SUCCESS = "success"
    PENDING = "pending"
    FAILED = "failed"


class SubAccountTransfer(models.Model):
    """A movement inside one family (a master and its sub-accounts): written with its posting, in
    the posting's own statement; `client_tran_id` is unique per master (a repeat, even a concurrent
    twin, fails at the constraint and moves nothing)."""

    master = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    from_account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    to_account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    asset = models.ForeignKey("accounts.Asset", on_delete=models.PROTECT, related_name="+")
    amount = AmountField()
    client_tran_id = models.CharField(max_length=100, help_text="The client's id, or one made by the service.")
    kind = models.CharField(max_length=16, choices=TransferKind.choices)
    status = models.CharField(max_length=8, choices=TransferStatus.choices, default=TransferStatus.SUCCESS)
    posting = models.OneToOneField(
        "accounts.Posting", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["master", "created_at", "id"], name="subacct_transfer_master_time"),
            models.Index(fields=["from_account", "created_at", "id"], name="subacct_transfer_from_time"),
            models.Index(fields=["to_account", "created_at", "id"], name="subacct_transfer_to_time"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["master", "client_tran_id"], name="client_tran_id_once_per_master"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="subacct_transfer_amount_positive"),
            models.CheckConstraint(condition=~Q(from_account=F("to_account")), name="subacct_transfer_not_to_self"),
            models.CheckConstraint(
                condition=~Q(status="success") | Q(posting__isnull=False), name="subacct_transfer_success_has_posting"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.client_tran_id}: {self.amount} {self.asset_id} {self.from_account_id}->{self.to_account_id}"
