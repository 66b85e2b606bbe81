"""Fund collection (issue 15, item 9; docs/subaccounts.md, "Fund collection"): a master's task that
moves every sub-account's free balances to the master, created here and run by a worker
(subaccounts/tasks.py, which hands itself in through `set_worker`).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from accounts import ledger, policy
from accounts.ledger.errors import AccountMayNotSend, InsufficientBalance
from accounts.ledger.models import Balance, BusinessType, LedgerAccount
from accounts.models import User
from exchange.runtime.handoff import WorkerHandOff
from subaccounts import errors
from subaccounts.models import CollectionStatus, FundCollection, FundCollectionOutcome, OutcomeStatus
from subaccounts.services import require_master

logger = logging.getLogger(__name__)

COLLECT_KIND = BusinessType.VIRTUAL_DISTRIBUTE  # money moving inside the family, as universal transfers
# A task still INIT or PROCESSING this long after its last transition is handed to a worker again
# (settings.FUND_COLLECTION_RETRY_AFTER_SECONDS overrides it).
COLLECTION_RETRY_AFTER_SECONDS = 60
COMMENT_LENGTH = 1000


def fund_collection_create(*, master: User, client_request_id: str, remark: str = "") -> FundCollection:
    """A collection task in status INIT, handed to a worker once committed. A clientRequestId the
    master used before is -1010; while another task of the master is INIT, -10324. Both are
    unique constraints (the second a partial one on the master's INIT task), so concurrent twins
    cannot both pass; the read after the failure only chooses the answer."""
    require_master(master)
    now = timezone.now()
    try:
        with transaction.atomic():
            collection = FundCollection.objects.create(
                master=master,
                client_request_id=client_request_id,
                remark=remark,
                status=CollectionStatus.INIT,
                created_at=now,
                updated_at=now,
            )
            _hand_off.after_commit(collection.pk)
    except IntegrityError as exc:
        if FundCollection.objects.filter(master_id=master.pk, client_request_id=client_request_id).exists():
            raise errors.DuplicateClientRequestId() from exc
        raise errors.CollectRequestRepeated() from exc
    logger.info("Fund collection %s (%s) created by master %s", collection.pk, client_request_id, master.pk)
    return collection


# Set by subaccounts/tasks.py when it loads (the app's ready() imports it). With the broker down a
# collection stays INIT; fund_collections_retry_stuck hands it over later.
_hand_off = WorkerHandOff(tasks_module="subaccounts.tasks", what="fund collections")
set_worker = _hand_off.set_worker


class _BalancesChanged(Exception):
    """The sub-account's free balances under the ledger's lock are not the ones read before it."""


def _free_balances(account_id: int) -> dict[str, Decimal]:
    rows = Balance.objects.filter(account_id=account_id, free__gt=0).values_list("asset__code", "free")
    return dict(sorted(rows))


def _why_not_collectable(master: User, sub: User) -> str:
    if not policy.may_receive(master):
        return "the master account is frozen or deactivated"
    if not sub.is_active:
        return "deactivated"
    if sub.is_frozen:
        return "frozen"
    if not policy.may_send(sub):
        return "barred from sending funds"
    return ""


def _record_outcome(collection_id: int, sub_id: int, status: OutcomeStatus, reason: str = "") -> None:
    """Keep what this task did with the sub-account, unless a run of it decided that already."""
    try:
        with transaction.atomic():
            FundCollectionOutcome.objects.create(
                collection_id=collection_id,
                sub_id=sub_id,
                status=status,
                reason=reason[:255],
                created_at=timezone.now(),
            )
    except IntegrityError:
        if not FundCollectionOutcome.objects.filter(collection_id=collection_id, sub_id=sub_id).exists():
            raise


def _collect_one(collection: FundCollection, master: User, sub: User) -> None:
    """Move all of `sub`'s free balances to `master` in one posting, whose reference and outcome row
    are unique per task and sub-account: a second run (a redelivery, a twin) posts nothing. The
    amounts are the free balances as they are under the ledger's lock: first read before it,
    together with the account's ledger seq, and posted only if no posting has touched the account
    since (or the guard finds the same balances under the lock); when they changed, both ledger
    rows are locked in the ledger's order and the balances read again under the lock."""
    why = _why_not_collectable(master, sub)
    if why:
        _record_outcome(collection.pk, sub.pk, OutcomeStatus.REFUSED, why)
        return
    try:
        try:
            # The seq first: a posting between the two reads changes it, and the guard then reads again.
            seq = LedgerAccount.objects.filter(user_id=sub.pk).values_list("seq", flat=True).first()
            free = _free_balances(sub.pk)

            def guard() -> None:
                if _free_balances(sub.pk) != free:
                    raise _BalancesChanged()

            _collection_post(collection, master, sub, free, guard=guard, seq=seq)
        except (_BalancesChanged, InsufficientBalance):
            with transaction.atomic():
                list(
                    LedgerAccount.objects.select_for_update()
                    .filter(user_id__in=[master.pk, sub.pk])
                    .order_by("user_id")
                    .values_list("user_id", flat=True)
                )
                _collection_post(collection, master, sub, _free_balances(sub.pk))
    except AccountMayNotSend:  # frozen or barred after the check above: the ledger's row says so
        _record_outcome(collection.pk, sub.pk, OutcomeStatus.REFUSED, "may not send funds (frozen or barred)")
    except IntegrityError:
        # Another run of this task collected it first (the reference and the outcome are unique).
        if not FundCollectionOutcome.objects.filter(collection_id=collection.pk, sub_id=sub.pk).exists():
            raise


def _collection_post(
    collection: FundCollection, master: User, sub: User, free: dict[str, Decimal], *, guard=None, seq=None
) -> None:
    if not free:
        _record_outcome(collection.pk, sub.pk, OutcomeStatus.EMPTY)
        return
    ledger.post(
        senders=(sub.pk,),
        legs=[leg for code, amount in free.items() for leg in ledger.move(sub.pk, master.pk, code, amount)],
        kind=COLLECT_KIND,
        reference=f"fund-collect:{collection.pk}:{sub.pk}",
        memo=f"collection {collection.client_request_id}"[:255],
        guard=guard,
        unchanged_since=(sub.pk, seq) if guard is not None and seq is not None else None,
        row=ledger.LinkedRow(
            FundCollectionOutcome,
            {"collection_id": collection.pk, "sub_id": sub.pk, "status": OutcomeStatus.COLLECTED.value, "reason": ""},
        ),
    )


def fund_collection_run(*, collection_id: int) -> FundCollection:
    """Collect every sub-account of the task's master, then settle the task: SUCCESS when none was
    refused, PARTIAL_SUCCESS when some were collected and some refused, FAILED when every one that
    was not empty was refused (the reasons in `comment`). Safe to run twice, at the same time, or
    again after a crash at any point: each sub-account is decided once per task (its outcome row),
    and the task settles once (compare-and-set from PROCESSING)."""
    claimed = FundCollection.objects.filter(
        pk=collection_id, status__in=[CollectionStatus.INIT, CollectionStatus.PROCESSING]
    ).update(status=CollectionStatus.PROCESSING, updated_at=timezone.now(), attempts=F("attempts") + 1)
    collection = FundCollection.objects.select_related("master").get(pk=collection_id)
    if not claimed:
        return collection  # settled already
    master = collection.master
    decided = FundCollectionOutcome.objects.filter(collection_id=collection_id).values_list("sub_id", flat=True)
    for sub in User.objects.filter(master_id=master.pk).exclude(pk__in=list(decided)).order_by("id"):
        _collect_one(collection, master, sub)
    return _collection_settle(collection)


def _collection_settle(collection: FundCollection) -> FundCollection:
    outcomes = list(FundCollectionOutcome.objects.filter(collection_id=collection.pk).select_related("sub"))
    refused = [o for o in outcomes if o.status == OutcomeStatus.REFUSED]
    collected = sum(o.status == OutcomeStatus.COLLECTED for o in outcomes)
    if not refused:
        status, comment = CollectionStatus.SUCCESS, ""
    else:
        status = CollectionStatus.PARTIAL_SUCCESS if collected else CollectionStatus.FAILED
        reasons = "; ".join(f"{o.sub.email} ({o.reason})" for o in refused)
        comment = f"Not collected from {len(refused)} of {len(outcomes)} sub-accounts: {reasons}."
        if len(comment) > COMMENT_LENGTH:
            comment = comment[: COMMENT_LENGTH - 3] + "..."
    now = timezone.now()
    FundCollection.objects.filter(pk=collection.pk, status=CollectionStatus.PROCESSING).update(
        status=status, comment=comment, finished_at=now, updated_at=now
    )
    collection.refresh_from_db()
    logger.info("Fund collection %s settled: %s", collection.pk, collection.status)
    return collection


def fund_collections_retry_stuck(*, older_than_seconds: float | None = None) -> int:
    """Hand every task still INIT or PROCESSING long after its last transition to a worker again (a
    worker killed with its message unacknowledged, a broker down at enqueue time). Running a task
    again is safe (fund_collection_run)."""
    if older_than_seconds is None:
        older_than_seconds = getattr(settings, "FUND_COLLECTION_RETRY_AFTER_SECONDS", COLLECTION_RETRY_AFTER_SECONDS)
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than_seconds)
    unfinished = [CollectionStatus.INIT, CollectionStatus.PROCESSING]
    stuck = FundCollection.objects.filter(status__in=unfinished, updated_at__lt=cutoff)
    handed = 0
    for pk in list(stuck.values_list("pk", flat=True)):
        # Claimed by a compare-and-set on updated_at, so that a second sweep does not hand it over again.
        with transaction.atomic():
            if stuck.filter(pk=pk).update(updated_at=now):
                _hand_off.after_commit(pk)
                handed += 1
    return handed
