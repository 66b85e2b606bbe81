"""The spec's sub-account endpoints (issue 15, items 1-6). All are signed (USER_DATA): they read or
move a family's money. Master endpoints refuse a sub-account's key, sub-account endpoints refuse any
other key, both with -1152 (subaccounts/errors.py); an e-mail that is not one of the caller's own
sub-accounts is -1151, whoever has it."""

from __future__ import annotations

from rest_framework.response import Response

from accounts import policy
from exchange.api.auth import Security
from exchange.api.params import Param, ParamSpec, check_skip
from exchange.api.views import GatewayApi
from subaccounts import presenters, selectors, services

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
        asset = services.asset_by_code(p["asset"])
        if asset is not None:  # an unknown asset is refused by the service (-1025)
            self.require_key_type(policy.fund_key_type(asset))
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
        asset = services.asset_by_code(p["asset"])
        if asset is not None:
            self.require_key_type(policy.fund_key_type(asset))
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
