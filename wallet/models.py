"""Wallet: networks of each coin, deposit addresses, deposits, withdrawals, the withdrawal
whitelist, and the simulated chain's own tables (wallet/chain/simulator.py)."""

from __future__ import annotations

import re
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from accounts.ledger.models import AmountField, Asset
from exchange.runtime.ttlcache import ReferenceQuerySet


class Network(models.Model):
    coin = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="networks")
    network = models.CharField(max_length=16, help_text="e.g. BTC, ETH, TRX")
    name = models.CharField(max_length=64)
    address_regex = models.CharField(max_length=255)
    memo_regex = models.CharField(max_length=255, blank=True, help_text="Empty when the network has no memo/tag.")
    deposit_enable = models.BooleanField(default=True)
    withdraw_enable = models.BooleanField(default=True)
    min_confirm = models.PositiveIntegerField(default=1, help_text="Confirmations before a deposit is credited.")
    unlock_confirm = models.IntegerField(default=0)
    withdraw_desc = models.CharField(max_length=255, blank=True)
    withdraw_fee = AmountField(default=Decimal(0))
    withdraw_integer_multiple = AmountField(default=Decimal("0.00000001"))
    withdraw_max = AmountField(default=Decimal("1000000"))
    withdraw_min = AmountField(default=Decimal("0.0001"))
    same_address = models.BooleanField(default=False)

    class Meta:
        ordering = ["coin__code", "network"]
        constraints = [models.UniqueConstraint(fields=["coin", "network"], name="network_once_per_coin")]

    def __str__(self) -> str:
        return f"{self.coin.code} on {self.network}"


class DepositAddress(models.Model):
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="deposit_addresses")
    network = models.ForeignKey(Network, on_delete=models.PROTECT, related_name="addresses")
    address = models.CharField(max_length=128)
    tag = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["account", "network"], name="one_deposit_address_per_network"),
            models.UniqueConstraint(fields=["network", "address", "tag"], name="deposit_address_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.address}{f' ({self.tag})' if self.tag else ''}"


class DepositStatus(models.IntegerChoices):
    PROCESSING = 0
    SUCCESS = 1
    FAILED = 2
    NEED_FILL_DATA = 3


class Deposit(models.Model):
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="deposits")
    network = models.ForeignKey(Network, on_delete=models.PROTECT, related_name="deposits")
    address = models.CharField(max_length=128)
    tag = models.CharField(max_length=64, blank=True)
    amount = AmountField()
    tx_id = models.CharField(max_length=128)
    output_index = models.PositiveIntegerField(default=0)
    status = models.SmallIntegerField(choices=DepositStatus.choices, default=DepositStatus.PROCESSING)
    confirmations = models.PositiveIntegerField(default=0)
    inserted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    credited_at = models.DateTimeField(null=True, blank=True)
    travel_rule_required = models.BooleanField(default=False)
    travel_rule_data = models.JSONField(null=True, blank=True, help_text="Originator details filled by operators.")

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["network", "tx_id", "output_index"], name="deposit_once_per_output"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="deposit_amount_positive"),
        ]
        indexes = [
            # The deposits that still need something (the dashboard's travel-rule queue): a few rows
            # of a table that only grows.
            models.Index(
                fields=["status"],
                condition=Q(status__in=[DepositStatus.PROCESSING, DepositStatus.NEED_FILL_DATA]),
                name="deposit_open",
            ),
        ]

    def __str__(self) -> str:
        return f"deposit #{self.pk} {self.amount} {self.network}"


class WithdrawalStatus(models.IntegerChoices):
    PROCESSING = 0
    SUCCESS = 1
    FAILED = 2


# A sent withdrawal's confirmations are followed until it has this many.
CONFIRMATIONS_FOLLOWED = 100


class WithdrawalStage(models.TextChoices):
    """The settlement state machine; every transition is a compare-and-set."""

    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    QUEUED = "QUEUED"
    BROADCASTING = "BROADCASTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class Withdrawal(models.Model):
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="withdrawals")
    network = models.ForeignKey(Network, on_delete=models.PROTECT, related_name="withdrawals")
    address = models.CharField(max_length=128)
    tag = models.CharField(max_length=64, blank=True)
    amount = AmountField(help_text="Sent to the address; the fee comes on top.")
    fee = AmountField()
    withdraw_order_id = models.CharField(max_length=30, null=True, blank=True)
    stage = models.CharField(max_length=20, choices=WithdrawalStage.choices)
    tx_id = models.CharField(max_length=128, blank=True)
    confirmations = models.PositiveIntegerField(default=0)
    info = models.CharField(max_length=255, blank=True)
    applied_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    attempts = models.PositiveIntegerField(default=0)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Operator who approved or rejected it.",
    )
    # Four eyes (WITHDRAWAL_FOUR_EYES_ABOVE): the first of two approvals; decided_by is the second.
    first_approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="First approver of a withdrawal that needs two; the second must be someone else.",
    )
    first_approved_at = models.DateTimeField(null=True, blank=True)
    # The four-eyes decision is taken when the withdrawal is applied, at the prices of that moment,
    # and kept: a reference price edited afterwards (even to 0) never lets one person approve it
    # (wallet.approvals.needs_two_approvals).
    approval_value = AmountField(
        null=True,
        blank=True,
        help_text="Amount plus fee in the approval currency (PHP) at the reference price when applied.",
    )
    needs_two_approvals = models.BooleanField(
        default=False, help_text="Decided when applied (or later raised, never lowered): two approvers, not one."
    )

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["account", "withdraw_order_id"],
                condition=Q(withdraw_order_id__isnull=False),
                name="withdraw_order_id_once_per_account",
            ),
            models.CheckConstraint(condition=Q(amount__gt=0) & Q(fee__gte=0), name="withdrawal_amounts"),
            models.CheckConstraint(
                condition=Q(first_approved_by__isnull=True) | ~Q(first_approved_by=models.F("decided_by")),
                name="withdrawal_two_approvers",
            ),
        ]
        indexes = [
            # The open ones: the beat's sweep for stuck withdrawals (every minute) and the dashboard's
            # queues read these, never the settled history.
            models.Index(
                fields=["stage", "updated_at"],
                condition=Q(
                    stage__in=[WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING]
                ),
                name="withdrawal_open",
            ),
            # Sent ones still gaining confirmations (withdrawals_refresh_confirmations).
            models.Index(
                fields=["id"],
                condition=Q(stage=WithdrawalStage.SUCCEEDED, confirmations__lt=CONFIRMATIONS_FOLLOWED),
                name="withdrawal_confirming",
            ),
        ]

    def __str__(self) -> str:
        return f"withdrawal #{self.pk} {self.amount} {self.network} ({self.stage})"

    @property
    def status(self) -> int:
        if self.stage == WithdrawalStage.SUCCEEDED:
            return WithdrawalStatus.SUCCESS
        if self.stage == WithdrawalStage.FAILED:
            return WithdrawalStatus.FAILED
        return WithdrawalStatus.PROCESSING


class WhitelistAddress(models.Model):
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="withdraw_whitelist")
    network = models.ForeignKey(Network, on_delete=models.PROTECT, related_name="+")
    address = models.CharField(max_length=128)
    tag = models.CharField(max_length=64, blank=True)
    name = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "withdrawal whitelist entry"
        verbose_name_plural = "withdrawal whitelist"
        constraints = [
            models.UniqueConstraint(fields=["account", "network", "address", "tag"], name="whitelist_entry_once")
        ]

    def __str__(self) -> str:
        return f"{self.name or self.address} ({self.network})"

    def clean(self) -> None:
        """The address and memo match the network's formats: checked by full_clean, which the admin's
        form and the audited service (exchange.backoffice.changes) both run."""
        network = self.network if self.network_id is not None else None
        if network is None:
            return
        if self.address and not re.fullmatch(network.address_regex, self.address):
            raise ValidationError({"address": f"Not an address of {network} ({network.address_regex})."})
        if self.tag and not network.memo_regex:
            raise ValidationError({"tag": f"{network} has no memo/tag."})
        if self.tag and not re.fullmatch(network.memo_regex, self.tag):
            raise ValidationError({"tag": f"Not a memo of {network} ({network.memo_regex})."})


# --- the simulated chain -------------------------------------------------------------------------


class SimBlockHeight(models.Model):
    network = models.CharField(max_length=16, unique=True)
    height = models.BigIntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.network} at {self.height}"


class SimTransaction(models.Model):
    """A transaction on the simulated chain: an incoming deposit or one of our broadcasts."""

    network = models.CharField(max_length=16)
    tx_id = models.CharField(max_length=128)
    output_index = models.PositiveIntegerField(default=0)
    address = models.CharField(max_length=128)
    tag = models.CharField(max_length=64, blank=True)
    amount = AmountField()
    block_height = models.BigIntegerField()
    incoming = models.BooleanField(default=True)
    fails = models.BooleanField(default=False, help_text="The chain will report it failed.")
    client_reference = models.CharField(max_length=64, null=True, blank=True, unique=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["network", "tx_id", "output_index"], name="sim_tx_output_once")]

    def __str__(self) -> str:
        return f"{self.network} {self.tx_id}:{self.output_index}"


class SimBroadcastFailure(models.Model):
    """Tests and demos: broadcasts to this address fail."""

    address = models.CharField(max_length=128, unique=True)

    def __str__(self) -> str:
        return self.address


# --- transfers between accounts ------------------------------------------------------------------


class TransferFee(models.Model):
    """Fee charged to the sender of a transfer, per asset (none configured: 0)."""

    asset = models.OneToOneField(Asset, on_delete=models.PROTECT, related_name="transfer_fee")
    fee = AmountField(default=Decimal(0))

    objects = ReferenceQuerySet.as_manager()  # cached per process (wallet/transfers/services.py)

    def __str__(self) -> str:
        return f"{self.fee} {self.asset}"


class Transfer(models.Model):
    sender = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="transfers_sent")
    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="transfers_received")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    amount = AmountField()
    fee = AmountField(default=Decimal(0))
    target_address = models.CharField(max_length=254, help_text="The recipient as the sender wrote it.")
    message = models.CharField(max_length=255, blank=True)
    client_transfer_id = models.CharField(max_length=100, null=True, blank=True)
    status = models.CharField(max_length=10, default="success")
    posting = models.OneToOneField("accounts.Posting", on_delete=models.PROTECT, related_name="transfer")
    api_version = models.CharField(max_length=4, default="v4")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    reversal_posting = models.OneToOneField(
        "accounts.Posting", null=True, blank=True, on_delete=models.PROTECT, related_name="reversed_transfer"
    )
    reversed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reversal_reason = models.CharField(max_length=255, blank=True)
    # Four eyes (TRANSFER_REVERSAL_FOUR_EYES_ABOVE): the Administrator who asked for the reversal; a
    # second one, never this one, posts it (reversed_by). Empty when one person reversed it alone.
    reversal_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reversal_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["sender", "client_transfer_id"],
                condition=Q(client_transfer_id__isnull=False),
                name="client_transfer_id_once_per_sender",
            ),
            models.CheckConstraint(condition=Q(amount__gt=0) & Q(fee__gte=0), name="transfer_amounts"),
            models.CheckConstraint(condition=~Q(sender=models.F("recipient")), name="transfer_not_to_self"),
            models.CheckConstraint(
                condition=Q(reversed_by__isnull=True)
                | Q(reversal_requested_by__isnull=True)
                | ~Q(reversed_by=models.F("reversal_requested_by")),
                name="transfer_reversal_four_eyes",
            ),
        ]

    def __str__(self) -> str:
        return f"transfer #{self.pk} {self.amount} {self.asset_id} {self.sender_id}->{self.recipient_id}"
