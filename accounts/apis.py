from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone
from rest_framework.response import Response

from accounts import presenters, selectors
from accounts.errors import HistorySpanTooLong, NotASubAccount
from accounts.models import Asset, User
from exchange.api.auth import Security
from exchange.api.errors import EndTimeBeforeStartTime, InvalidParameter
from exchange.api.params import Param, ParamSpec
from exchange.api.timewindow import LAST_MICROSECOND, end_from_ms, from_ms, shift
from exchange.api.views import GatewayApi

HISTORY_SPAN = timedelta(days=7)


class ApiKeyListApi(GatewayApi):
    """The caller's API keys."""

    security = Security.USER_DATA
    ip_weight = 1
    uid_weight = 1
    response_example = [
        {
            "apiKey": "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zvsw0MuIgwCIPy6utIco14y7Ju91duEh8A",
            "apiName": "trading bot",
            "apiType": ["Enable Spot", "Enable Convert"],
            "status": "ENABLE",
            "createTime": "1764000000000",
            "ipAccessRestrictions": ["203.0.113.7"],
        }
    ]

    def get(self, request):
        return Response([presenters.api_key_json(key) for key in selectors.api_key_list(user=self.account)])


_LIMIT_EXAMPLE = {
    "cashInLimit": "500000.00",
    "cashInRemaining": "499000.00",
    "cashOutLimit": "500000.00",
    "cashOutRemaining": "500000.00",
    "totalWithdrawLimit": "500000.00",
    "totalWithdrawRemaining": "500000.00",
}


class AccountInfoApi(GatewayApi):
    """Permissions, balances of every asset, base token and the daily/monthly/annual limits."""

    security = Security.USER_DATA
    ip_weight = 10
    uid_weight = 10
    response_example = {
        "canTrade": True,
        "canDeposit": True,
        "canWithdraw": True,
        "accountType": "SPOT",
        "updateTime": 1764000000000,
        "balances": [{"asset": "BTC", "free": "1.50000000", "locked": "0.00000000"}],
        "token": "PHP",
        "email": "user@example.com",
        "enableWithdrawWhitelist": False,
        "daily": _LIMIT_EXAMPLE,
        "monthly": _LIMIT_EXAMPLE,
        "annually": _LIMIT_EXAMPLE,
        "p2pDaily": None,
        "p2pMonthly": None,
        "p2pAnnually": None,
    }

    def get(self, request):
        return Response(presenters.account_info_json(selectors.account_info(user=self.account)))


class CryptoAccountListApi(GatewayApi):
    """Balance per currency: `balance` is the free amount, `pending_balance` the locked one."""

    security = Security.USER_DATA
    ip_weight = 1
    uid_weight = 1
    params_spec = ParamSpec((Param("currency", max_length=16, description="One currency, e.g. BTC."),))
    response_example = {
        "crypto-accounts": [
            {
                "id": "17-BTC",
                "name": "Bitcoin",
                "currency": "BTC",
                "balance": "1.50000000",
                "pending_balance": "0.00000000",
            }
        ]
    }

    def get(self, request):
        currency = self.params["currency"]
        if currency is not None and not Asset.objects.filter(code=currency).exists():
            raise InvalidParameter("currency")
        balances = selectors.crypto_accounts(user=self.account, currency=currency)
        return Response(presenters.crypto_accounts_json(balances, account_id=self.account.pk))


class TransactionHistoryApi(GatewayApi):
    """Postings that changed the account's balance of one token, oldest first. At most 7 days:
    only startTime gives the 7 days after it, only endTime the 7 days before it, neither the last 7."""

    security = Security.USER_DATA
    ip_weight = 0
    uid_weight = 20
    params_spec = ParamSpec(
        (
            Param("tokenId", required=True, max_length=16, description="Asset code, e.g. BTC."),
            Param("startTime", "LONG", min=0, description="ms"),
            Param("endTime", "LONG", min=0, description="ms"),
            Param("subUserId", "LONG", min=1, description="A sub-account of the caller (masters only)."),
            Param("pageNum", "INT", default=1, min=1, max=1000),
            Param("pageSize", "INT", default=20, min=1, max=100),
        )
    )
    response_example = {
        "transactions": [
            {
                "txId": "1029",
                "bizSubject": "CHAIN_DEPOSIT",
                "status": "SUCCESS",
                "changed": "0.50000000",
                "tokenId": "BTC",
                "time": "1764000000000",
            }
        ],
        "meta": {"has_next": False},
    }

    def get(self, request):
        params = self.params
        asset = Asset.objects.filter(code=params["tokenId"]).first()
        if asset is None:
            raise InvalidParameter("tokenId")
        start, end = _history_window(params["startTime"], params["endTime"])
        user = self.account
        if params["subUserId"] is not None:
            user = User.objects.filter(pk=params["subUserId"], master_id=self.account.pk).first()
            if user is None:
                raise NotASubAccount()
        page = selectors.transaction_history(
            user=user, asset=asset, start=start, end=end, page=params["pageNum"], size=params["pageSize"]
        )
        return Response(presenters.transaction_history_json(page))


def _history_window(start_ms: int | None, end_ms: int | None) -> tuple[datetime, datetime]:
    if start_ms is not None and end_ms is not None:
        start, end = from_ms(start_ms, "startTime"), end_from_ms(end_ms)
        if end < start:
            raise EndTimeBeforeStartTime()
        if end - start > HISTORY_SPAN + LAST_MICROSECOND:
            raise HistorySpanTooLong()
        return start, end
    if start_ms is not None:
        start = from_ms(start_ms, "startTime")
        return start, shift(start, HISTORY_SPAN, "startTime")
    end = end_from_ms(end_ms) if end_ms is not None else timezone.now()
    return shift(end, -HISTORY_SPAN, "endTime"), end
