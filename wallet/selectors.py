"""Reads of the wallet: model instances and Decimals, for the API (wallet/presenters.py renders
them as the spec says), the admin, tasks and other apps alike."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from accounts.models import Asset, Balance, User
from exchange.runtime import replicas
from wallet import errors
from wallet.models import Deposit, Network, WhitelistAddress, Withdrawal, WithdrawalStage


def network_get(*, coin: str, network: str) -> Network:
    """A coin's network by their names; UnknownCoin or UnknownNetwork (the API's codes) when there
    is no such coin or the coin has no such network."""
    found = Network.objects.select_related("coin").filter(coin__code=coin, network=network).first()
    if found is None:
        if not Network.objects.filter(coin__code=coin).exists():
            raise errors.UnknownCoin()
        raise errors.UnknownNetwork()
    return found


@dataclass(frozen=True, slots=True)
class CoinBalance:
    """A coin, its networks (by network name) and an account's free and locked amounts of it."""

    asset: Asset
    networks: list[Network]
    free: Decimal
    locked: Decimal


def coin_list(*, user: User) -> list[CoinBalance]:
    """Every coin by code, with its networks and `user`'s balance (zero where it holds none)."""
    networks: dict[int, list[Network]] = {}
    for network in Network.objects.select_related("coin").order_by("network"):
        networks.setdefault(network.coin_id, []).append(network)
    held = {b.asset_id: b for b in Balance.objects.filter(account=user)}
    coins = []
    for asset in Asset.objects.order_by("code"):
        balance = held.get(asset.id)
        coins.append(
            CoinBalance(
                asset=asset,
                networks=networks.get(asset.id, []),
                free=balance.free if balance else Decimal(0),
                locked=balance.locked if balance else Decimal(0),
            )
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
) -> list[Deposit]:
    """`user`'s deposits inserted within [start, end], oldest first, with their network and coin.
    The list may come from the replica (exchange/runtime/replicas.py); a look-up by transaction or
    deposit id reads the primary."""

    def read(alias: str) -> list[Deposit]:
        return _deposits(alias, user, coin, tx_id, statuses, start, end, offset, limit, deposit_id)

    if tx_id or deposit_id is not None:
        return read(replicas.PRIMARY)
    return replicas.history_read(read, account_ids=[user.pk])


def _deposits(alias, user, coin, tx_id, statuses, start, end, offset, limit, deposit_id) -> list[Deposit]:
    deposits = (
        Deposit.objects.using(alias)
        .select_related("network__coin")
        .filter(account=user, inserted_at__gte=start, inserted_at__lte=end)
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
    return list(deposits.order_by("inserted_at", "id")[offset : offset + limit])


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
) -> list[Withdrawal]:
    """`user`'s withdrawals applied within [start, end], oldest first, with their network and coin.
    `status` is the spec's (0 processing, 1 success, 2 failed). The list may come from the replica;
    a look-up by withdrawOrderId reads the primary (the id `withdraw/apply` just answered)."""

    def read(alias: str) -> list[Withdrawal]:
        return _withdrawals(alias, user, coin, withdraw_order_id, status, start, end, offset, limit)

    if withdraw_order_id:
        return read(replicas.PRIMARY)
    return replicas.history_read(read, account_ids=[user.pk])


def _withdrawals(alias, user, coin, withdraw_order_id, status, start, end, offset, limit) -> list[Withdrawal]:
    withdrawals = (
        Withdrawal.objects.using(alias)
        .select_related("network__coin")
        .filter(account=user, applied_at__gte=start, applied_at__lte=end)
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
    return list(withdrawals.order_by("applied_at", "id")[offset : offset + limit])


def whitelist_list(*, user: User, coin: str | None, network: str | None, address: str | None) -> list[WhitelistAddress]:
    entries = WhitelistAddress.objects.select_related("network__coin").filter(account=user)
    if coin:
        entries = entries.filter(network__coin__code=coin)
    if network:
        entries = entries.filter(network__network=network)
    if address:
        entries = entries.filter(address=address)
    return list(entries.order_by("id"))
