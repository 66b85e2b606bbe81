"""Deposits: each account's address on a network, deposits the chain shows, the travel rule's hold
and the credit.

Every credit goes through the ledger, once: a deposit is unique per network, transaction id and
output, and it moves from PROCESSING to SUCCESS by a compare-and-set that only one caller wins. No
database transaction is held open across a chain adapter call.
"""

from __future__ import annotations

import logging
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import ledger
from accounts.ledger.models import BusinessType
from accounts.limits import tier_for, value_in
from accounts.models import SystemRole, User
from exchange.backoffice.services import require_permission, require_reason, staff_action, summary
from wallet import errors
from wallet.chain import adapter
from wallet.models import Deposit, DepositAddress, DepositStatus, Network
from wallet.selectors import network_get

logger = logging.getLogger(__name__)

# Who fills a held deposit's travel-rule data: "change deposit", Treasury's and Administrators'
# (exchange/backoffice/roles.py).
TRAVEL_RULE_PERMISSION = "wallet.change_deposit"
RECHECK_PERMISSION = "wallet.change_deposit"  # the same "change deposit": asking the chain again
# The deposit's fields the audit trail pictures before and after.
AUDITED_FIELDS = ("account", "network", "amount", "status", "confirmations", "tx_id", "credited_at")


def deposit_address_get(*, account: User, coin: str, network: str) -> DepositAddress:
    """The account's address on this network: the same one every time.

    The chain adapter makes a new address outside any database transaction (it may be a network
    call); two requests racing for the first address both ask, and the unique constraint keeps one
    of the two answers, which both then return."""
    net = network_get(coin=coin, network=network)
    if not net.deposit_enable:
        raise errors.DepositSuspended(coin, network)
    existing = DepositAddress.objects.filter(account=account, network=net).first()
    if existing is not None:
        return existing
    address, tag = adapter().new_address(network=net, account_id=account.pk)
    try:
        with transaction.atomic():
            return DepositAddress.objects.create(account=account, network=net, address=address, tag=tag)
    except IntegrityError:  # another request made it meanwhile: return that one
        return DepositAddress.objects.get(account=account, network=net)


# --- deposits ------------------------------------------------------------------------------------


def deposit_record(
    *,
    network: Network,
    tx_id: str,
    output_index: int,
    address: str,
    tag: str,
    amount: Decimal,
    confirmations: int,
    failed: bool = False,
) -> Deposit | None:
    """Record a deposit the chain showed us and move it along; None when the address is not one of
    ours. Idempotent: a deposit is unique per network, transaction id and output, so the scan may
    show it again and again.

    A new deposit worth at least TRAVEL_RULE_THRESHOLD (in the currency of the owner's limit tier,
    at the asset's reference price) is held for travel-rule data (NEED_FILL_DATA) before it can be
    credited; so is one of an asset without a price, since its value cannot be known."""
    owner = DepositAddress.objects.filter(network=network, address=address, tag=tag).first()
    if owner is None:
        return None
    deposit = Deposit.objects.filter(network=network, tx_id=tx_id, output_index=output_index).first()
    if deposit is None:
        threshold = settings.TRAVEL_RULE_THRESHOLD
        tier = tier_for(owner.account)
        currency = tier.currency if tier else "PHP"
        value = value_in(currency, network.coin, amount)
        if network.coin.code != currency and not network.coin.reference_price > 0:
            value = None  # no price: fail closed, so the deposit waits for travel-rule data
        held = bool(threshold) and (value is None or value >= threshold)
        try:
            with transaction.atomic():
                deposit = Deposit.objects.create(
                    account=owner.account,
                    network=network,
                    address=address,
                    tag=tag,
                    amount=amount,
                    tx_id=tx_id,
                    output_index=output_index,
                    confirmations=confirmations,
                    travel_rule_required=held,
                    status=DepositStatus.NEED_FILL_DATA if held else DepositStatus.PROCESSING,
                )
        except IntegrityError:
            deposit = Deposit.objects.get(network=network, tx_id=tx_id, output_index=output_index)
    return deposit_advance(deposit=deposit, confirmations=confirmations, failed=failed)


def deposit_advance(*, deposit: Deposit, confirmations: int | None = None, failed: bool = False) -> Deposit:
    """Move a deposit along: it stays PROCESSING until it has its network's minimum confirmations,
    and is then credited, once; it becomes FAILED when the chain says so; in NEED_FILL_DATA it
    waits for travel-rule data. The confirmations are kept up to date until it is credited."""
    if confirmations is not None and confirmations != deposit.confirmations and deposit.credited_at is None:
        Deposit.objects.filter(pk=deposit.pk).update(confirmations=confirmations)
        deposit.confirmations = confirmations
    if deposit.status in (DepositStatus.SUCCESS, DepositStatus.FAILED):
        return deposit
    if failed:
        Deposit.objects.filter(pk=deposit.pk, credited_at__isnull=True).update(status=DepositStatus.FAILED)
        deposit.refresh_from_db()
        return deposit
    if deposit.status == DepositStatus.NEED_FILL_DATA:
        return deposit
    if deposit.confirmations < deposit.network.min_confirm:
        return deposit
    with transaction.atomic():
        # A compare-and-set: only one caller moves the deposit from PROCESSING to SUCCESS, and only
        # that caller credits it (the posting's reference is unique besides).
        won = Deposit.objects.filter(pk=deposit.pk, status=DepositStatus.PROCESSING, credited_at__isnull=True).update(
            status=DepositStatus.SUCCESS, credited_at=timezone.now()
        )
        if won:
            ledger.post(
                legs=ledger.move(
                    # The customer's shard of the outside world's account (accounts/ledger/system.py).
                    ledger.shard_account_id(SystemRole.WORLD, deposit.account_id),
                    deposit.account_id,
                    deposit.network.coin.code,
                    deposit.amount,
                ),
                kind=BusinessType.CHAIN_DEPOSIT,
                reference=f"deposit:{deposit.pk}",
                memo=f"{deposit.network} {deposit.tx_id}:{deposit.output_index}",
            )
    deposit.refresh_from_db()
    return deposit


def deposit_fill_travel_rule(*, deposit: Deposit, data: dict, filled_by: User, reason: str | None) -> Deposit:
    """Fill the travel-rule data of a held deposit (NEED_FILL_DATA), by a staff member with
    TRAVEL_RULE_PERMISSION, for `reason` (where the data comes from); audited
    ("deposit.travel_rule") in the same transaction as the data and, once confirmed, the credit.
    Refused before anything changes without a reason (ReasonRequired), without the permission
    (StaffNotPermitted, a PermissionDenied), for a deposit that does not wait for the data and for
    empty data (ValueError)."""
    reason = require_reason(reason)
    require_permission(filled_by, TRAVEL_RULE_PERMISSION, "You may not fill travel-rule data.")
    if deposit.status != DepositStatus.NEED_FILL_DATA:
        raise ValueError("This deposit does not wait for travel-rule data.")
    if not data:
        raise ValueError("Travel-rule data is empty.")
    with staff_action(
        actor=filled_by,
        action="deposit.travel_rule",
        reason=reason,
        target=deposit,
        fields=AUDITED_FIELDS,
    ) as draft:
        Deposit.objects.filter(pk=deposit.pk, status=DepositStatus.NEED_FILL_DATA).update(
            travel_rule_data={**data, "filled_by": filled_by.email, "filled_at": timezone.now().isoformat()},
            status=DepositStatus.PROCESSING,
        )
        deposit.refresh_from_db()
        filled = deposit_advance(deposit=deposit)
        draft.after = {**summary(filled, AUDITED_FIELDS), "travel_rule_data": filled.travel_rule_data}
    logger.info("Travel-rule data filled for deposit %s by %s", deposit.pk, filled_by.email)
    return filled


def deposits_recheck(*, checked_by: User, reason: str | None) -> int:
    """Ask the chain again now (deposits_scan), by a staff member with RECHECK_PERMISSION, for
    `reason`; audited ("deposit.recheck", with how many deposits were credited or advanced).
    Refused before the chain is asked without a reason (ReasonRequired) or the permission
    (StaffNotPermitted, a PermissionDenied). Returns deposits_scan's count."""
    reason = require_reason(reason)
    require_permission(checked_by, RECHECK_PERMISSION, "You may not check the chain for deposits.")
    with staff_action(actor=checked_by, action="deposit.recheck", reason=reason) as draft:
        touched = deposits_scan()
        draft.after = {"credited_or_advanced": touched}
    return touched


def deposits_scan() -> int:
    """Ask the chain about every enabled network's addresses; record and advance what it shows."""
    chain = adapter()
    touched = 0
    for network in Network.objects.select_related("coin").filter(deposit_enable=True):
        addresses = {(a.address, a.tag): a.account_id for a in DepositAddress.objects.filter(network=network)}
        if not addresses:
            continue
        for seen in chain.scan(network=network, addresses=addresses):
            deposit = deposit_record(
                network=network,
                tx_id=seen.tx_id,
                output_index=seen.output_index,
                address=seen.address,
                tag=seen.tag,
                amount=seen.amount,
                confirmations=seen.confirmations,
                failed=seen.failed,
            )
            touched += deposit is not None
    return touched
