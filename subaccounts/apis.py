"""The spec's sub-account endpoints (issue 15, items 1-6). All are signed (USER_DATA): they read or
move a family's money. Master endpoints refuse a sub-account's key, sub-account endpoints refuse any
other key, both with -1152 (subaccounts/errors.py); an e-mail that is not one of the caller's own
sub-accounts is -1151, whoever has it."""

from __future__ import annotations

from rest_framework.response import Response

from accounts import policy
from accounts.models import ApiKeyType
from exchange.api.auth import Security
from exchange.api.params import Param, ParamSpec, check_skip
from exchange.api.timewindow import window
from exchange.api.views import GatewayApi
from subaccounts import collection, presenters, selectors, services
from wallet import deposits as wallet_deposits
from wallet import presenters as wallet_presenters
from wallet import selectors as wallet_selectors
from wallet.apis import COIN, NINETY_DAYS, PAGING

EMAIL_LENGTH = 254


class SubAccountApi(GatewayApi):
    """A master's endpoint: the caller must be a master (not a sub-account)."""

    security = Security.USER_DATA
    ip_weight = 0
    uid_weight = 10
    caller_kind = "master"

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if self.caller_kind == "master":
            services.require_master(self.account)
        else:
            services.require_sub_account(self.account)


class SubAccountListApi(SubAccountApi):
    """The caller's sub-accounts, oldest first."""

    http_method_names = ["get", "head"]
    params_spec = ParamSpec(
        (
            Param("email", max_length=EMAIL_LENGTH),
            Param("page", "INT", default=1, min=1),
            Param("limit", "INT", default=10, min=1, max=200),
        )
    )
    response_example = {
        "subAccounts": [{"email": "sub1@example.com", "createTime": "1764000000000", "isFreeze": False}],
        "total": 1,
    }

    def get(self, request):
        p = self.params
        check_skip("page", (p["page"] - 1) * p["limit"])
        page = selectors.sub_account_list(master=self.account, email=p["email"], page=p["page"], limit=p["limit"])
        return Response(presenters.sub_account_list_json(page.sub_accounts, page.total))


class SubAccountCreateApi(SubAccountApi):
    """A virtual sub-account (at most 30 per master); it cannot log in."""

    http_method_names = ["post"]
    ip_weight = 60
    uid_weight = 30
    params_spec = ParamSpec((Param("accountName", required=True, max_length=EMAIL_LENGTH),))
    response_example = {"email": "sub1@example.com", "createTime": 1764000000000, "isFreeze": False}

    def post(self, request):
        sub = services.sub_account_create(master=self.account, email=self.params["accountName"])
        return Response(presenters.sub_account_json(sub, create_time_as_text=False))


class SubAccountAssetApi(SubAccountApi):
    """Every asset's free and locked balance of one of the caller's sub-accounts."""

    http_method_names = ["get", "head"]
    params_spec = ParamSpec((Param("email", required=True, max_length=EMAIL_LENGTH),))
    response_example = {"balances": [{"asset": "BTC", "free": "0.10000000", "locked": "0.00000000"}]}

    def get(self, request):
        sub = services.sub_account_of(master=self.account, email=self.params["email"])
        return Response(presenters.balances_json(selectors.sub_account_balances(sub=sub)))


_RESULT_EXAMPLE = {"clientTransferId": "my-id-1", "result": True}


class UniversalTransferApi(SubAccountApi):
    """Between the master and its sub-accounts (an omitted e-mail is the master). The key needs the
    asset's fund-moving type (Enable Fiat or Enable Crypto Wallet, -2019)."""

    http_method_names = ["post"]
    uid_weight = 100
    params_spec = ParamSpec(
        (
            Param("fromEmail", max_length=EMAIL_LENGTH),
            Param("toEmail", max_length=EMAIL_LENGTH),
            Param("clientTranId", max_length=100, description="Unique per master; made by the service when absent."),
            Param("asset", required=True, max_length=16),
            Param("amount", "DECIMAL", required=True),
        )
    )
    response_example = _RESULT_EXAMPLE

    def post(self, request):
        p = self.params
        policy.require_fund_key(self, p["asset"])
        transfer = services.universal_transfer(
            master=self.account,
            from_email=p["fromEmail"],
            to_email=p["toEmail"],
            asset_code=p["asset"],
            amount=p["amount"],
            client_tran_id=p["clientTranId"],
        )
        return Response(presenters.transfer_result_json(transfer))


class SubToMasterApi(SubAccountApi):
    """A sub-account sends to its master, with its own key."""

    http_method_names = ["post"]
    uid_weight = 100
    caller_kind = "sub"
    params_spec = ParamSpec(
        (
            Param("asset", required=True, max_length=16),
            Param("amount", "DECIMAL", required=True),
            Param("clientTranId", max_length=100, description="Unique per family; made by the service when absent."),
        )
    )
    response_example = _RESULT_EXAMPLE

    def post(self, request):
        p = self.params
        policy.require_fund_key(self, p["asset"])
        transfer = services.sub_to_master(
            sub=self.account, asset_code=p["asset"], amount=p["amount"], client_tran_id=p["clientTranId"]
        )
        return Response(presenters.transfer_result_json(transfer))


_HISTORY_EXAMPLE = {
    "result": [
        {
            "clientTranId": "my-id-1",
            "fromEmail": "master@example.com",
            "toEmail": "sub1@example.com",
            "asset": "BTC",
            "amount": "0.10000000",
            "createdAt": 1764000000000,
            "status": "success",
        }
    ],
    "total": 1,
}

_PERIOD_AND_PAGING = (
    Param("startTime", "LONG", min=0, description="ms"),
    Param("endTime", "LONG", min=0, description="ms, excluded"),
    Param("page", "INT", default=1, min=1),
    Param("limit", "INT", default=500, min=1, max=500),
)


class UniversalTransferHistoryApi(SubAccountApi):
    """The family's transfers, oldest first: from fromEmail (default: the master) or to toEmail."""

    http_method_names = ["get", "head"]
    params_spec = ParamSpec(
        (
            Param("fromEmail", max_length=EMAIL_LENGTH),
            Param("toEmail", max_length=EMAIL_LENGTH),
            Param("clientTranId", max_length=100),
            Param("tokenId", max_length=16),
            *_PERIOD_AND_PAGING,
        ),
        conflicts=(("fromEmail", "toEmail"),),
    )
    response_example = _HISTORY_EXAMPLE

    def get(self, request):
        p = self.params
        start, end = selectors.history_period(p["startTime"], p["endTime"])
        check_skip("page", (p["page"] - 1) * p["limit"])
        master = self.account
        from_account = to_account = None
        if p["toEmail"] is not None:
            to_account = services.sub_account_of(master=master, email=p["toEmail"])
        elif p["fromEmail"] is not None:
            from_account = services.sub_account_of(master=master, email=p["fromEmail"])
        else:
            from_account = master
        page = selectors.universal_transfer_history(
            master=master,
            from_account=from_account,
            to_account=to_account,
            client_tran_id=p["clientTranId"],
            asset_code=p["tokenId"],
            start=start,
            end=end,
            page=p["page"],
            limit=p["limit"],
        )
        return Response(presenters.transfer_history_json(page.transfers, page.total))


class SubTransferHistoryApi(SubAccountApi):
    """The calling sub-account's transfers in (type 1) or out (type 2, also for no or another type)."""

    http_method_names = ["get", "head"]
    caller_kind = "sub"
    params_spec = ParamSpec(
        (
            Param("asset", max_length=16),
            Param("type", max_length=16, description="1 in, 2 out; anything else means 2."),
            Param("clientTranId", max_length=100),
            *_PERIOD_AND_PAGING,
        )
    )
    response_example = _HISTORY_EXAMPLE

    def get(self, request):
        p = self.params
        start, end = selectors.history_period(p["startTime"], p["endTime"])
        check_skip("page", (p["page"] - 1) * p["limit"])
        direction = selectors.TRANSFERS_IN if (p["type"] or "").strip() == "1" else selectors.TRANSFERS_OUT
        page = selectors.sub_transfer_history(
            sub=self.account,
            direction=direction,
            asset_code=p["asset"],
            client_tran_id=p["clientTranId"],
            start=start,
            end=end,
            page=p["page"],
            limit=p["limit"],
        )
        return Response(presenters.transfer_history_json(page.transfers, page.total))


# --- API-key IP restrictions of a sub-account's key (issue 15, item 7) ----------------------------

_IP_RESTRICTION_EXAMPLE = {
    "apikey": "k5V49ldtn4tszj6W3hystegdfvmGbqDzjmkCtpTvC0G74WhK7yd4rfCTo4lShf",
    "ipList": ["8.8.8.8"],
    "ipRestrict": True,
    "role": "2,3,4,5,6",
    "updateTime": 1764000000000,
}
_KEY_OF_SUB = (
    Param("apikey", required=True, max_length=64, description="A key of the sub-account `email`."),
    Param("email", required=True, max_length=EMAIL_LENGTH),
)
# 30 addresses of the longest form (an IPv6 network, 43 characters) with commas and some spacing.
_IP_BATCH_LENGTH = 2000


class SubAccountIpRestrictionApi(SubAccountApi):
    """The IP restriction of one of the caller's sub-account's keys."""

    http_method_names = ["get", "head"]
    params_spec = ParamSpec(_KEY_OF_SUB)
    response_example = _IP_RESTRICTION_EXAMPLE

    def get(self, request):
        api_key = services.sub_account_api_key_get(
            master=self.account, email=self.params["email"], apikey=self.params["apikey"]
        )
        return Response(presenters.ip_restriction_json(api_key))


class SubAccountIpRestrictionAddApi(SubAccountApi):
    """Merge a batch into the key's IP list and set ipRestriction (1 trusted IPs only, 2 any
    address). Managing a key's access needs the caller's key to have Enable Account (-2019)."""

    http_method_names = ["post"]
    uid_weight = 30
    key_type = ApiKeyType.ACCOUNT
    params_spec = ParamSpec(
        (
            *_KEY_OF_SUB,
            Param(
                "ipAddress",
                max_length=_IP_BATCH_LENGTH,
                description="Comma-separated IPv4/IPv6 addresses or CIDR networks.",
            ),
            Param("ipRestriction", "ENUM", required=True, choices=(services.IP_RESTRICTED, services.IP_UNRESTRICTED)),
        )
    )
    response_example = _IP_RESTRICTION_EXAMPLE

    def post(self, request):
        p = self.params
        api_key = services.sub_account_ip_restriction_add(
            master=self.account,
            email=p["email"],
            apikey=p["apikey"],
            ip_addresses=p["ipAddress"],
            restrict=p["ipRestriction"] == services.IP_RESTRICTED,
        )
        return Response(presenters.ip_restriction_json(api_key))


class SubAccountIpRestrictionDeleteApi(SubAccountApi):
    """Remove a batch from the key's IP list (needs Enable Account, as adding does)."""

    http_method_names = ["post"]
    uid_weight = 30
    key_type = ApiKeyType.ACCOUNT
    params_spec = ParamSpec(
        (
            *_KEY_OF_SUB,
            Param("ipAddress", required=True, max_length=_IP_BATCH_LENGTH, description="Comma-separated batch."),
        )
    )
    response_example = _IP_RESTRICTION_EXAMPLE

    def post(self, request):
        p = self.params
        api_key = services.sub_account_ip_restriction_delete(
            master=self.account, email=p["email"], apikey=p["apikey"], ip_addresses=p["ipAddress"]
        )
        return Response(presenters.ip_restriction_json(api_key))


# --- deposits of a sub-account (issue 15, item 8): the wallet's own rules, for the sub-account ----


class SubAccountDepositAddressApi(SubAccountApi):
    """The sub-account's deposit address for a coin on a network (the wallet's, for that account)."""

    http_method_names = ["get", "head"]
    ip_weight = 1
    uid_weight = 1
    params_spec = ParamSpec(
        (
            Param("email", required=True, max_length=EMAIL_LENGTH),
            Param("coin", required=True, max_length=16),
            Param("network", required=True, max_length=16),
        )
    )
    response_example = {"address": "0x5b2e6f3f0b5c9a1d2e3f4a5b6c7d8e9f0a1b2c3d", "addressTag": "", "coin": "ETH"}

    def get(self, request):
        p = self.params
        sub = services.sub_account_of(master=self.account, email=p["email"])
        address = wallet_deposits.deposit_address_get(account=sub, coin=p["coin"], network=p["network"])
        return Response(wallet_presenters.deposit_address_json(address, coin=p["coin"]))


class SubAccountDepositHistoryApi(SubAccountApi):
    """The sub-account's deposits, oldest first; period at most 90 days (default: the last 90)."""

    http_method_names = ["get", "head"]
    ip_weight = 1
    uid_weight = 1
    params_spec = ParamSpec(
        (
            Param("email", required=True, max_length=EMAIL_LENGTH),
            COIN,
            Param("txId", max_length=128),
            Param("depositId", max_length=32),
            Param("status", "INT", min=0, max=3),
            *PAGING,
        )
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
        sub = services.sub_account_of(master=self.account, email=p["email"])
        start, end = window(p["startTime"], p["endTime"], span=NINETY_DAYS)
        deposits = wallet_selectors.deposit_list(
            user=sub,
            coin=p["coin"],
            tx_id=p["txId"],
            statuses=[p["status"]] if p["status"] is not None else None,
            start=start,
            end=end,
            offset=p["offset"],
            limit=p["limit"],
            deposit_id=p["depositId"],
        )
        return Response([wallet_presenters.deposit_json(deposit) for deposit in deposits])


# --- fund collection (issue 15, item 9) ----------------------------------------------------------

CLIENT_REQUEST_ID_LENGTH = 200  # spec
REMARK_LENGTH = 255


class FundCollectApi(SubAccountApi):
    """Collect every sub-account's free balances, all assets, into the master: a task in status INIT
    that a worker carries out (get-fund-record follows it). Signed like every endpoint of the family
    (it moves money), but the timestamp is optional: the spec lists none and the official Postman
    collection sends none. A repeat is harmless without it: the clientRequestId is unique per master
    (for ever, in the database) and the signature is remembered too. With a timestamp, its window
    is checked as everywhere. The key needs Enable Crypto Wallet and Enable Fiat (-2019): the
    collection moves assets of both kinds."""

    http_method_names = ["post"]
    ip_weight = 1
    uid_weight = 1
    timestamp_optional = True
    params_spec = ParamSpec(
        (
            Param(
                "clientRequestId",
                required=True,
                max_length=CLIENT_REQUEST_ID_LENGTH,
                description="Unique per master; a repeat is -1010.",
            ),
            Param("remark", max_length=REMARK_LENGTH, description="Kept with the task (the spec's LONG, as text)."),
        )
    )
    response_example = {"clientRequestId": "777d3f71-4715-4150-9fd1-d13246d7e02b", "status": "INIT", "comment": ""}

    def post(self, request):
        for key_type in (ApiKeyType.CRYPTO_WALLET, ApiKeyType.FIAT):
            self.require_key_type(key_type)
        p = self.params
        created = collection.fund_collection_create(
            master=self.account, client_request_id=p["clientRequestId"], remark=p["remark"] or ""
        )
        return Response(presenters.collection_json(created))


class FundRecordApi(SubAccountApi):
    """The master's collection tasks, oldest first (a bare array, as the spec shows)."""

    http_method_names = ["get", "head"]
    ip_weight = 1
    uid_weight = 1
    params_spec = ParamSpec(
        (
            Param("clientRequestId", max_length=CLIENT_REQUEST_ID_LENGTH),
            Param("page", "INT", default=1, min=1),
            Param("size", "INT", default=100, min=1, max=100),
        )
    )
    response_example = [{"clientRequestId": "09533266-1fea-11f0-8ff9-2a3efdea066c", "comment": "", "status": "SUCCESS"}]

    def get(self, request):
        p = self.params
        check_skip("page", (p["page"] - 1) * p["size"])
        collections = selectors.fund_collection_list(
            master=self.account, client_request_id=p["clientRequestId"], page=p["page"], size=p["size"]
        )
        return Response(presenters.collection_records_json(collections))
