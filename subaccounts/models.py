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


# --- fund collection (issue 15, item 9) ----------------------------------------------------------


class CollectionStatus(models.TextChoices):
    INIT = "INIT"
    PROCESSING = "PROCESSING"
    SUCCESS = "SUCCESS"
    PARTIAL_SUCCESS = "PARTIAL_SUCCESS"
    FAILED = "FAILED"


class FundCollection(models.Model):
    """A master's request to collect every sub-account's free balances (spec, "Collection task").
    `client_request_id` is unique per master; at most one task of a master is INIT at a time (a
    partial unique constraint: a concurrent second collect fails at it, -10324)."""

    master = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    client_request_id = models.CharField(max_length=200)
    remark = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=CollectionStatus.choices, default=CollectionStatus.INIT)
    comment = models.TextField(blank=True, help_text="Why not every sub-account was collected.")
    attempts = models.PositiveIntegerField(default=0, help_text="Runs of the task (a redelivery counts).")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField(help_text="Last transition; the sweep re-enqueues tasks left too long.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["updated_at"],
                condition=Q(status__in=["INIT", "PROCESSING"]),
                name="fund_collection_unfinished",
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["master", "client_request_id"], name="collect_request_id_once_per_master"),
            models.UniqueConstraint(fields=["master"], condition=Q(status="INIT"), name="collect_one_init_per_master"),
        ]

    def __str__(self) -> str:
        return f"{self.client_request_id} ({self.status})"


class OutcomeStatus(models.TextChoices):
    COLLECTED = "COLLECTED", "Collected (one posting)"
    EMPTY = "EMPTY", "Nothing to collect"
    REFUSED = "REFUSED", "Not collected (see the reason)"


class FundCollectionOutcome(models.Model):
    """What one collection task did with one sub-account: decided once per task and sub-account (a
    unique constraint), written with the posting when money moved. A task run again after a crash
    skips every sub-account that has its outcome."""

    collection = models.ForeignKey(FundCollection, on_delete=models.PROTECT, related_name="outcomes")
    sub = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=16, choices=OutcomeStatus.choices)
    reason = models.CharField(max_length=255, blank=True)
    posting = models.OneToOneField(
        "accounts.Posting", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["collection", "sub"], name="collect_once_per_task_and_sub"),
            models.CheckConstraint(
                condition=~Q(status="COLLECTED") | Q(posting__isnull=False),
                name="collect_outcome_collected_has_posting",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.collection_id}/{self.sub_id}: {self.status}"
