"""The back office's records: the staff audit trail and the four-eyes change requests.

Registered under the app label "exchange" (their tables, content types, permissions and migrations
date from when they lived in exchange/models.py; the label-"exchange" app is exchange/platform, whose
migrations hold them)."""

from django.conf import settings
from django.db import models


class StaffAction(models.Model):
    """The audit trail of the back office: every action a staff member takes in the admin that
    moves money or changes what a customer may do (approvals, adjustments, top-ups, API keys, bans,
    business status, freezes): who, when, what (the object and the action), why (a reason, always
    given) and a summary of the object before and after. Written by exchange.backoffice.services.staff_action
    in the action's own transaction, so an action that is undone leaves no record and a record
    never describes an action that did not happen. Append-only: the admin shows it read-only."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=48, db_index=True, help_text="e.g. withdrawal.approve")
    object_type = models.CharField(max_length=64, help_text="app_label.model of the object acted on")
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    reason = models.TextField()
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)

    class Meta:
        app_label = "exchange"
        ordering = ["-id"]
        indexes = [models.Index(fields=["object_type", "object_id"], name="staff_action_object")]
        constraints = [models.CheckConstraint(condition=~models.Q(reason=""), name="staff_action_has_reason")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_id} {self.action} {self.object_type}#{self.object_id}"


class ChangeStatus(models.TextChoices):
    PROPOSED = "PROPOSED"
    APPLIED = "APPLIED"
    CANCELLED = "CANCELLED"


class ChangeRequest(models.Model):
    """A change of a setting that matters to money (a reference price, a fee, a minimum, a limit, an
    account's master, ...) that would loosen a control: proposed by one staff member, applied only
    when a second Administrator approves it (exchange/backoffice/changes.py). `before` is the object's values
    when proposed: an approval is refused if they have changed since, so what the second person
    approves is exactly what will happen. Written only by exchange/backoffice/changes.py; the admin shows it
    read-only with the approve and cancel buttons."""

    action = models.CharField(max_length=48, help_text="e.g. asset.change")
    object_type = models.CharField(max_length=64, help_text="app_label.model of the object to change")
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200, blank=True)
    changes = models.JSONField(help_text="Field: new value.")
    before = models.JSONField(help_text="Field: value when proposed.")
    loosens = models.JSONField(default=list, help_text="The fields whose change loosens a control.")
    reason = models.TextField()
    status = models.CharField(max_length=10, choices=ChangeStatus.choices, default=ChangeStatus.PROPOSED)
    proposed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    proposed_at = models.DateTimeField(auto_now_add=True, db_index=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=255, blank=True)

    class Meta:
        app_label = "exchange"
        ordering = ["-id"]
        permissions = [("approve_changerequest", "Can approve a change proposed by another staff member")]
        indexes = [models.Index(fields=["object_type", "object_id"], name="change_request_object")]
        constraints = [
            models.CheckConstraint(condition=~models.Q(reason=""), name="change_request_has_reason"),
            models.CheckConstraint(
                condition=~models.Q(status=ChangeStatus.APPLIED) | ~models.Q(decided_by=models.F("proposed_by")),
                name="change_request_two_people",
            ),
        ]

    def __str__(self) -> str:
        return f"change #{self.pk} {self.action} {self.object_repr} ({self.status})"
