from __future__ import annotations

from datetime import timedelta

from rest_framework.response import Response

from accounts.models import ApiKeyType
from exchange.api.auth import Security
from exchange.api.errors import InvalidParameter
from exchange.api.params import MAX_SKIPPED_ROWS, Param, ParamSpec, ascii_int_list
from exchange.api.timewindow import window
from exchange.api.views import GatewayApi
from wallet import deposits, presenters, selectors, withdrawals

NINETY_DAYS = timedelta(days=90)
SEVEN_DAYS = timedelta(days=7)
COIN = Param("coin", max_length=16, description="Coin, e.g. BTC.")
NETWORK = Param("network", max_length=16, description="Network from the coin list, e.g. ETH.")
PAGING = (
    Param("startTime", "LONG", min=0, description="ms; default 90 days before endTime."),
    Param("endTime", "LONG", min=0, description="ms; default now."),
    Param("offset", "INT", default=0, min=0, max=MAX_SKIPPED_ROWS),
    Param("limit", "LONG", default=1000, min=1, max=1000),
)


class WalletApi(GatewayApi):
    security = Security.USER_DATA
    key_type = None


class CoinListApi(WalletApi):
    """Every coin with its networks and the caller's free and locked."""

    ip_weight = 10
    response_example = [
        {
            "coin": "USDT",
            "name": "Tether USD",
            "depositAllEnable": True,
            "withdrawAllEnable": True,
            "free": "100.000000",
            "locked": "0.000000",
            "transferPrecision": 6,
            "transferMinQuantity": "0.010000",
            "legalMoney": False,
            "networkList": [
                {
                    "network": "ETH",
                    "name": "Ethereum (ERC20)",
                    "addressRegex": "^0x[0-9a-fA-F]{40}$",
                    "memoRegex": "",
                    "depositEnable": True,
                    "withdrawEnable": True,
                    "minConfirm": 12,
                    "unLockConfirm": 0,
                    "withdrawDesc": "",
                    "withdrawFee": "5.000000",
                    "withdrawIntegerMultiple": "0.000001",
                    "withdrawMax": "1000000.000000",
                    "withdrawMin": "10.000000",
                    "sameAddress": False,
                }
            ],
        }
    ]

    def get(self, request):
        return Response([presenters.coin_json(coin) for coin in selectors.coin_list(user=self.account)])


class DepositAddressApi(WalletApi):
    """The caller's deposit address for a coin on a network (always the same one)."""

    ip_weight = 10
    params_spec = ParamSpec(
        (Param("coin", required=True, max_length=16), Param("network", required=True, max_length=16))
    )
    response_example = {"address": "0x5b2e6f3f0b5c9a1d2e3f4a5b6c7d8e9f0a1b2c3d", "addressTag": "", "coin": "ETH"}

    def get(self, request):
        address = deposits.deposit_address_get(
            account=self.account, coin=self.params["coin"], network=self.params["network"]
        )
        return Response(presenters.deposit_address_json(address, coin=self.params["coin"]))


class WithdrawApplyApi(WalletApi):
    """Withdraw to a whitelisted address; amount plus fee is held until the withdrawal settles."""

    ip_weight = 0
    uid_weight = 100
    key_type = ApiKeyType.CRYPTO_WALLET
    params_spec = ParamSpec(
        (
            Param("coin", required=True, max_length=16),
            Param("network", required=True, max_length=16),
            Param("address", required=True, max_length=128),
            Param("addressTag", max_length=64),
            Param("amount", "DECIMAL", required=True),
            Param(
                "withdrawOrderId", max_length=30, description="Client id, unique per account, at most 30 characters."
            ),
        )
    )
    response_example = {"id": "4012"}

    def post(self, request):
        p = self.params
        withdrawal = withdrawals.withdrawal_apply(
            account=self.account,
            coin=p["coin"],
            network=p["network"],
            address=p["address"],
            tag=p["addressTag"] or "",
            amount=p["amount"],
            withdraw_order_id=p["withdrawOrderId"],
        )
        return Response(presenters.withdrawal_applied_json(withdrawal))


def parse_statuses(text: str | None, allowed: range) -> list[int] | None:
    if text is None:
        return None
    values = ascii_int_list("statuses", text)
    if any(v not in allowed for v in values):
        raise InvalidParameter("statuses")
    return values


class DepositHistoryApi(WalletApi):
    """Deposits, oldest first. Period at most 90 days (default: the last 90)."""

    ip_weight = 2
    params_spec = ParamSpec(
        (
            COIN,
            Param("txId", max_length=128),
            Param("status", "INT", min=0, max=3),
            Param("statuses", max_length=32),
            *PAGING,
        ),
        conflicts=(("status", "statuses"),),
    )
    response_example = [
        {
            "id": "101",
            "address": "0x5b2e6f3f0b5c9a1d2e3f4a5b6c7d8e9f0a1b2c3d",
            "addressTag": "",
            "amount": "0.50000000",
            "coin": "ETH",
            "confirmNo": 12,
            "insertTime": 1764000000000,
            "network": "ETH",
            "status": 1,
            "txId": "0x9f1c...",
        }
    ]

    def get(self, request):
        p = self.params
        start, end = window(p["startTime"], p["endTime"], span=NINETY_DAYS)
        statuses = [p["status"]] if p["status"] is not None else parse_statuses(p["statuses"], range(4))
        deposits = selectors.deposit_list(
            user=self.account,
            coin=p["coin"],
            tx_id=p["txId"],
            statuses=statuses,
            start=start,
            end=end,
            offset=p["offset"],
            limit=p["limit"],
        )
        return Response([presenters.deposit_json(deposit) for deposit in deposits])


class WithdrawHistoryApi(WalletApi):
    """Withdrawals, oldest first. Period at most 90 days; with withdrawOrderId at most 7 (default the last 7)."""

    ip_weight = 2
    params_spec = ParamSpec(
        (COIN, Param("withdrawOrderId", max_length=30), Param("status", "INT", min=0, max=2), *PAGING)
    )
    response_example = [
        {
            "id": "4012",
            "address": "0x5b2e6f3f0b5c9a1d2e3f4a5b6c7d8e9f0a1b2c3d",
            "addressTag": "",
            "amount": "1.00000000",
            "applyTime": 1764000000000,
            "coin": "ETH",
            "confirmNo": 3,
            "info": "",
            "network": "ETH",
            "status": 1,
            "transactionFee": "0.00500000",
            "txId": "0x77ab...",
            "withdrawOrderId": "my-order-1",
        }
    ]

    def get(self, request):
        p = self.params
        span = SEVEN_DAYS if p["withdrawOrderId"] else NINETY_DAYS
        start, end = window(p["startTime"], p["endTime"], span=span)
        withdrawals = selectors.withdrawal_list(
            user=self.account,
            coin=p["coin"],
            withdraw_order_id=p["withdrawOrderId"],
            status=p["status"],
            start=start,
            end=end,
            offset=p["offset"],
            limit=p["limit"],
        )
        return Response([presenters.withdrawal_json(withdrawal) for withdrawal in withdrawals])


class WhitelistApi(WalletApi):
    """The caller's withdrawal whitelist (managed by operators)."""

    ip_weight = 1
    uid_weight = 1
    params_spec = ParamSpec((COIN, NETWORK, Param("address", max_length=128)))
    response_example = [
        {
            "address": "0x5b2e6f3f0b5c9a1d2e3f4a5b6c7d8e9f0a1b2c3d",
            "addressName": "cold wallet",
            "addressTag": "",
            "coin": "ETH",
            "network": "ETH",
        }
    ]

    def get(self, request):
        p = self.params
        entries = selectors.whitelist_list(
            user=self.account, coin=p["coin"], network=p["network"], address=p["address"]
        )
        return Response([presenters.whitelist_json(entry) for entry in entries])
