"""The wallet's records as the spec renders them: its field names, amounts as decimal strings with
the coin's transfer precision, times in ms. The selectors return models and Decimals; only the API
layer calls these."""

from __future__ import annotations

from exchange.api import formatting as fmt
from wallet.models import Deposit, DepositAddress, Network, WhitelistAddress, Withdrawal
from wallet.selectors import CoinBalance


def network_json(network: Network) -> dict:
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


def coin_json(coin: CoinBalance) -> dict:
    asset = coin.asset
    places = asset.transfer_precision
    return {
        "coin": asset.code,
        "name": asset.name,
        "depositAllEnable": any(n.deposit_enable for n in coin.networks),
        "withdrawAllEnable": any(n.withdraw_enable for n in coin.networks),
        "free": fmt.amount(coin.free, places),
        "locked": fmt.amount(coin.locked, places),
        "transferPrecision": places,
        "transferMinQuantity": fmt.amount(asset.transfer_min_quantity, places),
        "legalMoney": asset.is_fiat,
        "networkList": [] if asset.is_fiat else [network_json(n) for n in coin.networks],
    }


def deposit_address_json(address: DepositAddress, *, coin: str) -> dict:
    return {"address": address.address, "addressTag": address.tag, "coin": coin}


def deposit_json(deposit: Deposit) -> dict:
    network = deposit.network
    return {
        "id": str(deposit.pk),
        "address": deposit.address,
        "addressTag": deposit.tag,
        "amount": fmt.amount(deposit.amount, network.coin.transfer_precision),
        "coin": network.coin.code,
        "confirmNo": deposit.confirmations,
        "insertTime": fmt.millis(deposit.inserted_at),
        "network": network.network,
        "status": deposit.status,
        "txId": deposit.tx_id,
    }


def withdrawal_applied_json(withdrawal: Withdrawal) -> dict:
    return {"id": str(withdrawal.pk)}


def withdrawal_json(withdrawal: Withdrawal) -> dict:
    network = withdrawal.network
    places = network.coin.transfer_precision
    return {
        "id": str(withdrawal.pk),
        "address": withdrawal.address,
        "addressTag": withdrawal.tag,
        "amount": fmt.amount(withdrawal.amount, places),
        "applyTime": fmt.millis(withdrawal.applied_at),
        "coin": network.coin.code,
        "confirmNo": withdrawal.confirmations,
        "info": withdrawal.info,
        "network": network.network,
        "status": withdrawal.status,
        "transactionFee": fmt.amount(withdrawal.fee, places),
        "txId": withdrawal.tx_id,
        "withdrawOrderId": withdrawal.withdraw_order_id or "",
    }


def whitelist_json(entry: WhitelistAddress) -> dict:
    return {
        "address": entry.address,
        "addressName": entry.name,
        "addressTag": entry.tag,
        "coin": entry.network.coin.code,
        "network": entry.network.network,
    }
