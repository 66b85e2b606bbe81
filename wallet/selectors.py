from __future__ import annotations

from datetime import datetime

from accounts.models import Asset, Balance, User
from exchange.api import formatting as fmt
from wallet.models import Deposit, Network, WhitelistAddress, Withdrawal, WithdrawalStage


def _network_json(network: Network) -> dict:
    places = network.coin.transfer_precision
    return {
        "network": network.network,
        "name": network.name,
        "addressRegex": network.address_regex,
        "memoRegex": network.memo_regex,
        "depositEnable": network.deposit_enable,
        "withdrawEnable": network.withdraw_enable,
        "minConfirm": network.min_confirm,
        "unLockConfirm": network.unlock_confirm,
        "withdrawDesc": network.withdraw_desc,
        "withdrawFee": fmt.amount(network.withdraw_fee, places),
        "withdrawIntegerMultiple": fmt.amount(network.withdraw_integer_multiple, places),
        "withdrawMax": fmt.amount(network.withdraw_max, places),
        "withdrawMin": fmt.amount(network.withdraw_min, places),
        "sameAddress": network.same_address,
    }


def coin_list(*, user: User) -> list[dict]:
    networks: dict[int, list[Network]] = {}
    for network in Network.objects.select_related("coin").order_by("network"):
        networks.setdefault(network.coin_id, []).append(network)
    held = {b.asset_id: b for b in Balance.objects.filter(account=user)}
    coins = []
    for asset in Asset.objects.order_by("code"):
        nets = networks.get(asset.id, [])
        balance = held.get(asset.id)
        places = asset.transfer_precision
        coins.append(
            {
                "coin": asset.code,
                "name": asset.name,
                "depositAllEnable": any(n.deposit_enable for n in nets),
                "withdrawAllEnable": any(n.withdraw_enable for n in nets),
                "free": fmt.amount(balance.free if balance else 0, places),
                "locked": fmt.amount(balance.locked if balance else 0, places),
                "transferPrecision": places,
                "transferMinQuantity": fmt.amount(asset.transfer_min_quantity, places),
                "legalMoney": asset.is_fiat,
                "networkList": [] if asset.is_fiat else [_network_json(n) for n in nets],
            }
        )
    return coins


def deposit_list(
    *,
    user: User,
    coin: str | None,
    tx_id: str | None,
    statuses: list[int] | None,
    start: datetime,
    end: datetime,
    offset: int,
    limit: int,
    deposit_id: str | None = None,
) -> list[dict]:
    deposits = Deposit.objects.select_related("network__coin").filter(
        account=user, inserted_at__gte=start, inserted_at__lte=end
    )
    if coin:
        deposits = deposits.filter(network__coin__code=coin)
    if tx_id:
        deposits = deposits.filter(tx_id=tx_id)
    if statuses is not None:
        deposits = deposits.filter(status__in=statuses)
    if deposit_id is not None:
        deposits = (
            deposits.filter(pk=int(deposit_id))
            if deposit_id.isascii() and deposit_id.isdigit() and len(deposit_id) < 19
            else deposits.none()
        )
    return [
        {
            "id": str(d.pk),
            "address": d.address,
            "addressTag": d.tag,
            "amount": fmt.amount(d.amount, d.network.coin.transfer_precision),
            "coin": d.network.coin.code,
            "confirmNo": d.confirmations,
            "insertTime": fmt.millis(d.inserted_at),
            "network": d.network.network,
            "status": d.status,
            "txId": d.tx_id,
        }
        for d in deposits.order_by("inserted_at", "id")[offset : offset + limit]
    ]


def withdrawal_list(
    *,
    user: User,
    coin: str | None,
    withdraw_order_id: str | None,
    status: int | None,
    start: datetime,
    end: datetime,
    offset: int,
    limit: int,
) -> list[dict]:
    withdrawals = Withdrawal.objects.select_related("network__coin").filter(
        account=user, applied_at__gte=start, applied_at__lte=end
    )
    if coin:
        withdrawals = withdrawals.filter(network__coin__code=coin)
    if withdraw_order_id:
        withdrawals = withdrawals.filter(withdraw_order_id=withdraw_order_id)
    if status is not None:
        stages = {
            0: [WithdrawalStage.AWAITING_APPROVAL, WithdrawalStage.QUEUED, WithdrawalStage.BROADCASTING],
            1: [WithdrawalStage.SUCCEEDED],
            2: [WithdrawalStage.FAILED],
        }[status]
        withdrawals = withdrawals.filter(stage__in=stages)
    return [
        {
            "id": str(w.pk),
            "address": w.address,
            "addressTag": w.tag,
            "amount": fmt.amount(w.amount, w.network.coin.transfer_precision),
            "applyTime": fmt.millis(w.applied_at),
            "coin": w.network.coin.code,
            "confirmNo": w.confirmations,
            "info": w.info,
            "network": w.network.network,
            "status": w.status,
            "transactionFee": fmt.amount(w.fee, w.network.coin.transfer_precision),
            "txId": w.tx_id,
            "withdrawOrderId": w.withdraw_order_id or "",
        }
        for w in withdrawals.order_by("applied_at", "id")[offset : offset + limit]
    ]


def whitelist_list(*, user: User, coin: str | None, network: str | None, address: str | None) -> list[dict]:
    entries = WhitelistAddress.objects.select_related("network__coin").filter(account=user)
    if coin:
        entries = entries.filter(network__coin__code=coin)
    if network:
        entries = entries.filter(network__network=network)
    if address:
        entries = entries.filter(address=address)
    return [
        {
            "address": e.address,
            "addressName": e.name,
            "addressTag": e.tag,
            "coin": e.network.coin.code,
            "network": e.network.network,
        }
        for e in entries.order_by("id")
    ]
