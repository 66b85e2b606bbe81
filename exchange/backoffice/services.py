"""The staff audit trail (`staff_action`): every staff action that moves money or changes what a
customer may do is recorded with its reason in the action's own transaction; `summary` pictures a
row for it. `require_permission` is the check such an action makes first, inside the service, so
the rule holds whoever calls it (the admin, a management command, a future API)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

from django.core.exceptions import PermissionDenied
from django.db import models, transaction

from exchange.backoffice.models import StaffAction

REASON_REQUIRED = "A reason is required: say why (it is kept in the audit trail with your name)."


class ReasonRequired(ValueError):
    """A staff action without a reason: refused before anything changes."""

    def __init__(self) -> None:
        super().__init__(REASON_REQUIRED)


class StaffNotPermitted(PermissionDenied):
    """The acting staff member lacks the permission the action needs: refused before anything
    changes. The admin shows its message; anything else that calls the service sees a
    PermissionDenied."""


def require_permission(actor, permission: str, refusal: str) -> None:
    """Raise StaffNotPermitted(`refusal`) unless `actor` is an active staff member holding
    `permission` ("app_label.codename", e.g. "wallet.change_withdrawal")."""
    if not (actor is not None and actor.is_active and actor.is_staff and actor.has_perm(permission)):
        raise StaffNotPermitted(refusal)


def require_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ReasonRequired()
    return reason


def summary(obj: models.Model | None, fields: tuple[str, ...] | None = None) -> dict:
    """A JSON-safe picture of a row (its concrete fields, or `fields`): foreign keys by id, Decimals
    and times as text. Never secrets: API keys' secrets are not fields of the row (accounts/models.py)."""
    if obj is None:
        return {}
    picture = {}
    for model_field in obj._meta.concrete_fields:
        if fields is not None and model_field.name not in fields:
            continue
        if "secret" in model_field.name or model_field.name == "password":
            continue
        value = getattr(obj, model_field.attname)
        picture[model_field.name] = _jsonable(value)
    return picture


def _jsonable(value):
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, Decimal):
        return f"{value.normalize():f}"
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    try:
        json.dumps(value)
    except TypeError:
        return str(value)
    return value


jsonable = _jsonable  # for exchange/backoffice/changes.py, which keeps values the same way


@dataclass
class StaffActionDraft:
    """What the action fills in while it runs: the object (when it is made by the action) and the
    picture after."""

    target: models.Model | None = None
    after: dict = field(default_factory=dict)
    record: StaffAction | None = None


@contextmanager
def staff_action(
    *,
    actor,
    action: str,
    reason: str | None,
    target: models.Model | None = None,
    before: dict | None = None,
    fields: tuple[str, ...] | None = None,
) -> Iterator[StaffActionDraft]:
    """Run a staff action and record it in the same transaction:

        with staff_action(actor=request.user, action="withdrawal.approve", reason=reason,
                          target=withdrawal, fields=AUDITED_FIELDS) as draft:
            withdrawal = ...  # the change itself, in the same transaction
            draft.after = summary(withdrawal, AUDITED_FIELDS)

    `fields`: the picture before is the target's `fields` (`summary(target, fields)`), unless
    `before` gives another. A missing reason is refused (ReasonRequired) before the action runs; an
    action that raises leaves no record (and, being in the same transaction, no change)."""
    reason = require_reason(reason)
    if before is None and fields is not None:
        before = summary(target, fields)
    draft = StaffActionDraft(target=target)
    with transaction.atomic():
        yield draft
        obj = draft.target
        draft.record = StaffAction.objects.create(
            actor=actor,
            action=action,
            object_type=obj._meta.label_lower if obj is not None else "",
            object_id=str(obj.pk) if obj is not None and obj.pk is not None else "",
            object_repr=str(obj)[:200] if obj is not None else "",
            reason=reason,
            before=_jsonable(before or {}),
            after=_jsonable(draft.after or {}),
        )
