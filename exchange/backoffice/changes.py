"""Audited, four-eyes changes of the settings that matter to money (docs/operations.md, "Settings
that matter to money").

Every staff change of such a setting goes through `change_submit`, with a reason, and lands in the
audit trail (exchange.backoffice.services.staff_action). The rule, per field, is declared by the app that owns
the model (`guard(...)`, e.g. accounts/controls.py, wallet/controls.py):

- a change that TIGHTENS a control (a price raised, a fee or minimum raised, a limit lowered, a
  switch turned off) or touches no control applies at once: reason + audit record;
- a change that LOOSENS one (a price used for a threshold lowered, a limit or maximum raised, a fee
  or minimum lowered, a withdrawal switch turned on, an account's master changed) is only PROPOSED
  (exchange.ChangeRequest): nothing changes until a second Administrator, not the proposer, approves
  it (`change_approve`), which applies it in one transaction with its own audit record. A change
  that mixes both waits as a whole.

A model may add a `precondition` (e.g. an account is re-parented only with nothing on it), checked
when proposed and again, under the row's lock, when approved. An approval is refused when the
object's values have moved since the proposal (the approver approves exactly what happens).

How a field loosens: LOWER (lowering it loosens), HIGHER (raising it loosens), ON (turning it on
loosens), ANY (every change loosens), AUDITED (any change applies at once, audited), a function
of (old, new) for a rule of its own, e.g. `moved_more_than_bps(50)` for a price that staff may nudge
alone but not move far, or `OfRow(check)` for a rule that needs the locked row too (its history: e.g.
convert/controls.py bounds what an anchor may move alone over 24 hours, whoever moves it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.db import models, transaction
from django.utils import timezone

from exchange.backoffice.models import ChangeRequest, ChangeStatus
from exchange.backoffice.services import StaffNotPermitted, jsonable, require_reason, staff_action

LOWER = "lower"
HIGHER = "higher"
ON = "on"
ANY = "any"
AUDITED = "audited"

APPROVE_PERMISSION = "exchange.approve_changerequest"


class ChangeRefused(ValueError):
    """The change is refused as asked (who asks, what it would do, or the object moved since)."""


class ChangeNotPermitted(ChangeRefused, StaffNotPermitted):
    """The acting staff member lacks the permission: a ChangeRefused (the admin shows its message)
    and a PermissionDenied, like every staff service's refusal of that kind."""


@dataclass(frozen=True)
class OfRow:
    """A field's rule that needs the row, not only the old and new values: `check(row, old, new)`
    is called with the row locked (select_for_update) by change_submit, so two staff members
    changing the same row are judged one after the other, each seeing what the other did."""

    check: Callable[[models.Model, object, object], bool]


@dataclass(frozen=True)
class Guarded:
    model: type[models.Model]
    action: str  # the audit trail's prefix, e.g. "asset": asset.change, asset.propose, asset.approve
    fields: dict[str, str | Callable]
    # Raises ChangeRefused when the change may not happen now (called with the locked row).
    precondition: Callable[[models.Model, dict], None] | None = None
    # Applies the change to the locked row and returns it; default: set the fields and save them.
    apply: Callable[[models.Model, dict], models.Model] | None = None


_GUARDED: dict[str, Guarded] = {}


def guard(
    model: type[models.Model],
    *,
    action: str,
    fields: dict[str, str | Callable],
    precondition: Callable[[models.Model, dict], None] | None = None,
    apply: Callable[[models.Model, dict], models.Model] | None = None,
) -> None:
    """Declare how staff change `model`: its changeable fields and how each loosens a control.
    Called by the owning app when it is ready; a field not declared cannot be changed here."""
    for name, how in fields.items():
        model._meta.get_field(name)  # FieldDoesNotExist for a typo
        if not callable(how) and not isinstance(how, OfRow) and how not in (LOWER, HIGHER, ON, ANY, AUDITED):
            raise ValueError(f"{model._meta.label}.{name}: unknown rule {how!r}")
    _GUARDED[model._meta.label_lower] = Guarded(model, action, dict(fields), precondition, apply)


def guarded(model: type[models.Model]) -> Guarded:
    try:
        return _GUARDED[model._meta.label_lower]
    except KeyError:
        raise ChangeRefused(f"{model._meta.verbose_name} is not changed through the audited service.") from None


# --- values ------------------------------------------------------------------------------------


def _stored(model: type[models.Model], name: str, value):
    """`value` of field `name` as kept on a ChangeRequest: a related object by its key, Decimals as
    text (exchange.backoffice.services.jsonable)."""
    field = model._meta.get_field(name)
    if isinstance(value, models.Model):
        value = value.pk
    if field.is_relation:
        return value
    return jsonable(field.to_python(value))


def _current(obj: models.Model, name: str):
    field = obj._meta.get_field(name)
    return _stored(type(obj), name, getattr(obj, field.attname))


def _number(value) -> Decimal | None:
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def loosens(how: str | Callable | OfRow, old, new, *, row: models.Model | None = None) -> bool:
    """Whether changing a field from `old` to `new` loosens the control it is (see the module doc).
    A value that cannot be compared counts as loosening (fail closed), and so does a rule of the row
    (OfRow) asked without the row."""
    if isinstance(how, OfRow):
        return old != new if row is None else bool(how.check(row, old, new))
    if callable(how):
        return bool(how(old, new))
    if how == AUDITED:
        return False
    if how == ANY:
        return old != new
    if how == ON:
        return bool(new) and not bool(old)
    before, after = _number(old), _number(new)
    if before is None or after is None:
        return old != new
    return after < before if how == LOWER else after > before


def moved_more_than_bps(bps: int) -> Callable:
    """A rule for a price: a move of more than `bps` basis points either way (or from or to 0, or a
    value that is not a number) loosens; a smaller one applies at once."""

    def rule(old, new) -> bool:
        before, after = _number(old), _number(new)
        if before is None or after is None or before <= 0 or after <= 0:
            return old != new
        return abs(after - before) * 10000 > before * bps

    return rule


@dataclass(frozen=True)
class ChangeOutcome:
    applied: bool  # True: done now; False: proposed (`request`) or nothing to do (`changed` empty)
    changed: dict
    request: ChangeRequest | None = None
    obj: models.Model | None = None


def _require_may_change(actor, model: type[models.Model]) -> None:
    opts = model._meta
    if not (actor.is_active and actor.is_staff and actor.has_perm(f"{opts.app_label}.change_{opts.model_name}")):
        raise ChangeNotPermitted(f"You may not change {opts.verbose_name_plural}.")


def _apply(spec: Guarded, obj: models.Model, changes: dict) -> models.Model:
    if spec.apply is not None:
        return spec.apply(obj, changes)
    return apply_fields(obj, changes)


def apply_fields(obj: models.Model, changes: dict) -> models.Model:
    """The default way a change is applied to the locked row: set the fields, validate them, save
    just them. A model's own `apply` (guard(..., apply=)) adds its side effects and calls this."""
    for name, value in changes.items():
        field = obj._meta.get_field(name)
        setattr(obj, field.attname, field.to_python(value) if not field.is_relation else value)
    obj.full_clean(exclude=[f.name for f in obj._meta.fields if f.name not in changes], validate_unique=True)
    obj.save(update_fields=[obj._meta.get_field(name).attname for name in changes])
    return obj


def _locked(model: type[models.Model], pk) -> models.Model:
    return model.objects.select_for_update().get(pk=pk)


def change_submit(*, actor, obj: models.Model, changes: dict, reason: str | None) -> ChangeOutcome:
    """Change `obj` (an existing row; only its primary key is used: the row is read again, locked)
    as `changes` ({field: new value}) asks, by `actor`, for `reason`. Applied at once when nothing
    loosens; otherwise proposed for a second Administrator. Raises ReasonRequired, ChangeRefused."""
    reason = require_reason(reason)
    spec = guarded(type(obj))
    _require_may_change(actor, spec.model)
    unknown = sorted(set(changes) - set(spec.fields))
    if unknown:
        raise ChangeRefused(f"Not changeable here: {', '.join(unknown)}.")
    with transaction.atomic():
        current = _locked(spec.model, obj.pk)
        wanted = {name: _stored(spec.model, name, value) for name, value in changes.items()}
        diff = {name: value for name, value in wanted.items() if _current(current, name) != value}
        if not diff:
            return ChangeOutcome(applied=False, changed={}, obj=current)
        before = {name: _current(current, name) for name in diff}
        if spec.precondition is not None:
            spec.precondition(current, diff)
        loose = [name for name, value in diff.items() if loosens(spec.fields[name], before[name], value, row=current)]
        if not loose:
            with staff_action(
                actor=actor, action=f"{spec.action}.change", reason=reason, target=current, before=before
            ) as draft:
                done = _apply(spec, current, diff)
                draft.after = {name: _current(done, name) for name in diff}
            return ChangeOutcome(applied=True, changed=diff, obj=done)
        with staff_action(
            actor=actor, action=f"{spec.action}.propose", reason=reason, target=current, before=before
        ) as draft:
            request = ChangeRequest.objects.create(
                action=f"{spec.action}.change",
                object_type=spec.model._meta.label_lower,
                object_id=str(current.pk),
                object_repr=str(current)[:200],
                changes=diff,
                before=before,
                loosens=loose,
                reason=reason,
                proposed_by=actor,
            )
            draft.after = {"proposed": diff, "loosens": loose, "change_request": request.pk}
        return ChangeOutcome(applied=False, changed=diff, request=request, obj=current)


def change_create(*, actor, model: type[models.Model], values: dict, reason: str | None) -> models.Model:
    """A new row of a guarded model (a new asset, network, fee, tier or limit), with a reason and an
    audit record. Applies at once: a new row loosens nothing that existed."""
    reason = require_reason(reason)
    spec = guarded(model)
    opts = model._meta
    if not (actor.is_active and actor.is_staff and actor.has_perm(f"{opts.app_label}.add_{opts.model_name}")):
        raise ChangeNotPermitted(f"You may not add {opts.verbose_name_plural}.")
    with staff_action(actor=actor, action=f"{spec.action}.create", reason=reason) as draft:
        obj = model(**values)
        obj.full_clean()
        obj.save()
        draft.target = obj
        draft.after = {f.name: _current(obj, f.name) for f in opts.concrete_fields if f.name != opts.pk.name}
    return obj


def _open_request(request_id: int) -> ChangeRequest:
    request = ChangeRequest.objects.select_for_update().get(pk=request_id)
    if request.status != ChangeStatus.PROPOSED:
        raise ChangeRefused(f"Change #{request.pk} is already {request.status.lower()}.")
    return request


def may_approve(user, request: ChangeRequest) -> bool:
    return (
        request.status == ChangeStatus.PROPOSED
        and request.proposed_by_id != user.pk
        and user.is_active
        and user.is_staff
        and user.has_perm(APPROVE_PERMISSION)
    )


def may_cancel(user, request: ChangeRequest) -> bool:
    return request.status == ChangeStatus.PROPOSED and (
        request.proposed_by_id == user.pk or (user.is_staff and user.has_perm(APPROVE_PERMISSION))
    )


def change_approve(*, request_id: int, approved_by, reason: str | None) -> ChangeRequest:
    """The second pair of eyes: apply a proposed change, once. Refused (ChangeRefused) for its
    proposer, for anyone without the approve permission, for a change already decided, when the
    object moved since the proposal, or when its precondition no longer holds."""
    reason = require_reason(reason)
    with transaction.atomic():
        request = _open_request(request_id)
        if request.proposed_by_id == approved_by.pk:
            raise ChangeRefused("You proposed this change: another Administrator must approve it.")
        if not may_approve(approved_by, request):
            raise ChangeNotPermitted("Only an Administrator may approve a change.")
        spec = _GUARDED.get(request.object_type)
        if spec is None:
            raise ChangeRefused(f"{request.object_type} is no longer changed through this service.")
        _require_may_change(approved_by, spec.model)
        current = _locked(spec.model, request.object_id)
        now = {name: _current(current, name) for name in request.changes}
        if now != request.before:
            raise ChangeRefused(
                f"{current} has changed since this was proposed: cancel it and propose the change again."
            )
        if spec.precondition is not None:
            spec.precondition(current, request.changes)
        with staff_action(
            actor=approved_by, action=f"{spec.action}.approve", reason=reason, target=current, before=now
        ) as draft:
            done = _apply(spec, current, request.changes)
            ChangeRequest.objects.filter(pk=request.pk, status=ChangeStatus.PROPOSED).update(
                status=ChangeStatus.APPLIED,
                decided_by=approved_by,
                decided_at=timezone.now(),
                decision_reason=reason[:255],
            )
            draft.after = {
                **{name: _current(done, name) for name in request.changes},
                "change_request": request.pk,
                "proposed_by": request.proposed_by_id,
            }
    request.refresh_from_db()
    return request


def change_cancel(*, request_id: int, cancelled_by, reason: str | None) -> ChangeRequest:
    """Drop a proposed change (its proposer, or an Administrator); nothing was changed."""
    reason = require_reason(reason)
    with transaction.atomic():
        request = _open_request(request_id)
        if not may_cancel(cancelled_by, request):
            raise ChangeNotPermitted("Only the proposer or an Administrator may cancel a proposed change.")
        with staff_action(actor=cancelled_by, action="change_request.cancel", reason=reason, target=request) as draft:
            ChangeRequest.objects.filter(pk=request.pk).update(
                status=ChangeStatus.CANCELLED,
                decided_by=cancelled_by,
                decided_at=timezone.now(),
                decision_reason=reason[:255],
            )
            draft.after = {"status": ChangeStatus.CANCELLED, "changes": request.changes}
    request.refresh_from_db()
    return request
