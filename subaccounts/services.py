"""Sub-account writes: creating virtual sub-accounts, and moving money inside a family (a master
and its sub-accounts).

A transfer is one VIRTUAL_DISTRIBUTE posting (the spec's business type for a master's virtual
sub-accounts; it counts against no limit, the family's money stays in the family) from the source
to the target account, with the SubAccountTransfer row written in the posting's own statement.
The row's clientTranId is unique per master: a repeat, even a concurrent twin, fails at that
constraint (or at the posting's reference) and moves nothing. The source is the posting's sender,
so a frozen sub-account (or master) cannot send, as its ledger row says under the lock.

A transfer the source's balance does not cover is recorded as a failed transfer (no posting) and
answered with `result: false`; its clientTranId is then spent. Every other refusal is an error and
records nothing.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from accounts import ledger, policy
from accounts import services as account_services
from accounts.errors import AccountMayNotSend
from accounts.ledger.errors import InsufficientBalance
from accounts.ledger.amounts import decimal_places
from accounts.ledger.models import Asset, Balance, BusinessType, LedgerAccount
from accounts.models import ApiKey, User
from exchange.ttlcache import TtlCache
from subaccounts import addresses, errors
from subaccounts.models import (
    CollectionStatus,
    FundCollection,
    FundCollectionOutcome,
    OutcomeStatus,
    SubAccountTransfer,
    TransferKind,
    TransferStatus,
)
from wallet.errors import InvalidAmount

logger = logging.getLogger(__name__)

TRANSFER_KIND = BusinessType.VIRTUAL_DISTRIBUTE
MAX_VIRTUAL_SUB_ACCOUNTS = 30  # per master (spec)

_assets = TtlCache(10.0)


def asset_by_code(code: str) -> Asset | None:
    return _assets.get(code, lambda: Asset.objects.filter(code=code).first())


def require_master(account: User) -> None:
    if account.master_id is not None:
        raise errors.MasterOnly()


def require_sub_account(account: User) -> None:
    if account.master_id is None:
        raise errors.SubAccountOnly()


def sub_account_of(*, master: User, email: str) -> User:
    """`master`'s sub-account with this e-mail (any case), or the virtual one created with this
    name (subaccounts/addresses.py); any other account is not found (-1151)."""
    candidates = addresses.lookup_addresses(master_id=master.pk, email=email)
    found = {sub.email: sub for sub in User.objects.filter(master_id=master.pk, email__in=candidates)}
    sub = next((found[address] for address in candidates if address in found), None)
    if sub is None:
        raise errors.SubAccountNotFound(email)
    return sub


def sub_account_create(*, master: User, email: str) -> User:
    """A virtual sub-account of `master` named `email`: its address is the name moved into the
    master's own part of the reserved domain (subaccounts/addresses.py), so it never takes a real
    customer's e-mail and a name can only be taken by one of the master's own sub-accounts. It has
    no usable password, so it cannot log in anywhere; it is reached through its master (and
    through its own API keys, which operators create in the admin). At most
    MAX_VIRTUAL_SUB_ACCOUNTS per master, counted under the master's row lock so that concurrent
    creations cannot pass the limit together."""
    require_master(master)
    address = addresses.virtual_address(master_id=master.pk, account_name=email)
    limit = MAX_VIRTUAL_SUB_ACCOUNTS
    try:
        with transaction.atomic():
            User.objects.select_for_update().filter(pk=master.pk).values_list("pk", flat=True).get()
            if User.objects.filter(master_id=master.pk, is_virtual=True).count() >= limit:
                raise errors.TooManySubAccounts(limit)
            if User.objects.filter(email=address).exists():  # only ever one of this master's own
                raise errors.AccountNameTaken()
            sub = account_services.user_create(email=address, master=master, is_virtual=True)
    except IntegrityError as exc:  # the same name created concurrently
        raise errors.AccountNameTaken() from exc
    logger.info("Virtual sub-account %s created for master %s", sub.pk, master.pk)
    return sub


def _check_amount(asset: Asset, amount: Decimal) -> None:
    if amount <= 0:
        raise InvalidAmount("must be positive")
    if decimal_places(amount) > asset.transfer_precision:  # counted exactly, not after normalize()'s rounding
        raise InvalidAmount(f"at most {asset.transfer_precision} decimal places")


def _transfer(
    *,
    master: User,
    source: User,
    target: User,
    asset: Asset,
    amount: Decimal,
    client_tran_id: str | None,
    kind: TransferKind,
) -> SubAccountTransfer:
    if source.pk == target.pk:
        raise errors.SameAccount()
    _check_amount(asset, amount)
    policy.require_may_send(source)  # again under the ledger's lock (senders)
    if not policy.may_receive(target):
        raise errors.TargetMayNotReceive()
    client_tran_id = client_tran_id or uuid.uuid4().hex
    values = {
        "master_id": master.pk,
        "from_account_id": source.pk,
        "to_account_id": target.pk,
        "asset_id": asset.pk,
        "amount": amount,
        "client_tran_id": client_tran_id,
        "kind": kind.value,
        "status": TransferStatus.SUCCESS.value,
    }
    try:
        result = ledger.post(
            senders=(source.pk,),
            legs=ledger.move(source.pk, target.pk, asset.code, amount),
            kind=TRANSFER_KIND,
            reference=f"subaccount-transfer:{master.pk}:{client_tran_id}",
            memo=f"{kind.value} {client_tran_id}"[:255],
            row=ledger.LinkedRow(SubAccountTransfer, values),
        )
    except IntegrityError as exc:
        raise errors.DuplicateClientTranId() from exc
    except InsufficientBalance:
        return _record_failure(values)
    stored = {"id": result.row_id, "posting_id": result.posting_id, "created_at": result.created_at, **values}
    return _instance(stored)


def _instance(stored: dict) -> SubAccountTransfer:
    fields = SubAccountTransfer._meta.concrete_fields
    return SubAccountTransfer.from_db("default", [f.attname for f in fields], [stored.get(f.attname) for f in fields])


def _record_failure(values: dict) -> SubAccountTransfer:
    """A transfer the balance did not cover: kept as failed (no posting); its clientTranId is spent.
    If a concurrent twin took the id first, the repeat is refused like any other."""
    try:
        with transaction.atomic():
            row = SubAccountTransfer.objects.create(
                **{**values, "status": TransferStatus.FAILED.value}, created_at=timezone.now()
            )
    except IntegrityError as exc:
        raise errors.DuplicateClientTranId() from exc
    return row


def universal_transfer(
    *,
    master: User,
    from_email: str | None,
    to_email: str | None,
    asset_code: str,
    amount: Decimal,
    client_tran_id: str | None = None,
) -> SubAccountTransfer:
    """Master to sub-account, sub-account to master or between two sub-accounts of `master`; an
    omitted e-mail is the master itself."""
    require_master(master)
    if from_email is None and to_email is None:
        raise errors.EmailRequired()
    asset = asset_by_code(asset_code)
    if asset is None:
        raise errors.NoSuchAsset("asset")
    _check_amount(asset, amount)  # every parameter before any look-up (issue 25, finding 7)
    source = sub_account_of(master=master, email=from_email) if from_email is not None else master
    target = sub_account_of(master=master, email=to_email) if to_email is not None else master
    return _transfer(
        master=master,
        source=source,
        target=target,
        asset=asset,
        amount=amount,
        client_tran_id=client_tran_id,
        kind=TransferKind.UNIVERSAL,
    )


def sub_to_master(
    *, sub: User, asset_code: str, amount: Decimal, client_tran_id: str | None = None
) -> SubAccountTransfer:
    """A sub-account sends to its own master (with the sub-account's key)."""
    require_sub_account(sub)
    asset = asset_by_code(asset_code)
    if asset is None:
        raise errors.NoSuchAsset("asset")
    master = User.objects.get(pk=sub.master_id)
    return _transfer(
        master=master,
        source=sub,
        target=master,
        asset=asset,
        amount=amount,
        client_tran_id=client_tran_id,
        kind=TransferKind.SUB_TO_MASTER,
    )


# --- API-key IP restrictions of a sub-account's key (issue 15, item 7) ----------------------------
#
# The master manages the IP list of one of its sub-account's keys. Every change goes through
# accounts.services.api_key_set_ip_restriction, whose save evicts the sub-account's keyring in
# this process at once and in every process on commit (accounts/keyring.py), so the gateway
# applies the new list (-2017 from elsewhere) from the very next request. Add and delete lock the
# key's row first, so concurrent batches on one key are applied one after the other and none is
# lost.

MAX_IP_ADDRESSES = 30  # per key: a list longer than that is refused (-1025)
IP_RESTRICTED = "1"  # ipRestriction: trusted IPs only
IP_UNRESTRICTED = "2"  # ipRestriction: any address


def ip_batch_parse(text: str | None) -> list[str]:
    """The addresses of a comma-separated batch (IPv4, IPv6, or a CIDR network of either), in
    their canonical text, in order, without repeats; blank entries are skipped. The first entry
    that is not an address is refused (-1025) and names it."""
    entries = [entry.strip() for entry in (text or "").split(",")]
    for entry in entries:
        if not entry:
            continue
        try:
            account_services.normalize_ip_list([entry])
        except ValueError as exc:
            raise errors.InvalidIpAddress(f"'{entry[:64]}' is not an IPv4 or IPv6 address or network") from exc
    return account_services.normalize_ip_list(entries)


def sub_account_api_key_get(*, master: User, email: str, apikey: str, lock: bool = False) -> ApiKey:
    """The key `apikey` of `master`'s sub-account `email` (-1151 for any other e-mail, and for a
    key that is not that sub-account's); with `lock`, its row locked until the transaction ends."""
    sub = sub_account_of(master=master, email=email)
    keys = ApiKey.objects.select_for_update() if lock else ApiKey.objects
    api_key = keys.filter(user_id=sub.pk, key=apikey).first()
    if api_key is None:
        raise errors.SubAccountKeyNotFound(email)
    return api_key


def sub_account_ip_restriction_add(
    *, master: User, email: str, apikey: str, ip_addresses: str | None, restrict: bool
) -> ApiKey:
    """Merge `ip_addresses` (a comma-separated batch) into the key's list (kept in order, without
    repeats) and set whether only the list may use the key. Refused, changing nothing (-1025): a
    bad address, a list of more than MAX_IP_ADDRESSES, or trusted IPs only with an empty list (a
    key nobody could use: the gateway would answer -1023)."""
    require_master(master)
    batch = ip_batch_parse(ip_addresses)
    with transaction.atomic():
        api_key = sub_account_api_key_get(master=master, email=email, apikey=apikey, lock=True)
        current = list(api_key.ip_list)
        merged = account_services.normalize_ip_list([*current, *batch])
        if len(merged) > MAX_IP_ADDRESSES:
            raise errors.InvalidIpAddress(f"a key's list holds at most {MAX_IP_ADDRESSES} addresses")
        if restrict and not merged:
            raise errors.InvalidIpAddress("trusted IPs only (ipRestriction=1) needs at least one address")
        if merged == current and restrict == api_key.ip_restrict:
            return api_key  # nothing to change (updateTime stays)
        api_key = account_services.api_key_set_ip_restriction(api_key=api_key, ip_restrict=restrict, ip_list=merged)
    logger.info("IP list of key %s… of sub-account %s set by master %s", apikey[:8], api_key.user_id, master.pk)
    return api_key


def sub_account_ip_restriction_delete(*, master: User, email: str, apikey: str, ip_addresses: str) -> ApiKey:
    """Remove the batch's addresses from the key's list (compared in canonical form; one not in the
    list is skipped). `ipRestrict` is left as it is: a restricted key whose list becomes empty is
    refused everywhere (-1023) until addresses are added or the restriction is lifted."""
    require_master(master)
    batch = ip_batch_parse(ip_addresses)
    if not batch:
        raise errors.InvalidIpAddress("send at least one address")
    removed = set(batch)
    with transaction.atomic():
        api_key = sub_account_api_key_get(master=master, email=email, apikey=apikey, lock=True)
        current = list(api_key.ip_list)
        remaining = [ip for ip in account_services.normalize_ip_list(current) if ip not in removed]
        if remaining == current:
            return api_key
        api_key = account_services.api_key_set_ip_restriction(
            api_key=api_key, ip_restrict=api_key.ip_restrict, ip_list=remaining
        )
    logger.info("IP list of key %s… of sub-account %s cut by master %s", apikey[:8], api_key.user_id, master.pk)
    return api_key


# --- fund collection (issue 15, item 9; docs/subaccounts.md, "Fund collection") -------------------

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
            _enqueue_collection_after_commit(collection.pk)
    except IntegrityError as exc:
        if FundCollection.objects.filter(master_id=master.pk, client_request_id=client_request_id).exists():
            raise errors.DuplicateClientRequestId() from exc
        raise errors.CollectRequestRepeated() from exc
    logger.info("Fund collection %s (%s) created by master %s", collection.pk, client_request_id, master.pk)
    return collection


def _enqueue_collection_after_commit(collection_id: int) -> None:
    from subaccounts.tasks import fund_collection_task

    # robust: with the broker down the task stays INIT; fund_collections_retry_stuck hands it over later.
    transaction.on_commit(lambda: fund_collection_task.delay(collection_id), robust=True)


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
                _enqueue_collection_after_commit(pk)
                handed += 1
    return handed
