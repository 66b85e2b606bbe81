from __future__ import annotations

from rest_framework.response import Response

from accounts import policy
from accounts.selectors import user_get_by_address
from exchange.api.auth import Security
from exchange.api.errors import NotFound
from exchange.api.params import Param, ParamSpec, check_skip
from exchange.api.views import GatewayApi
from wallet.transfers import presenters, selectors, services

_CREATED_EXAMPLE = {
    "transfer": {
        "id": "2001",
        "status": "success",
        "account": "PHP",
        "target_address": "friend@example.com",
        "amount": "150.00",
        "fee_amount": "0.00",
        "exchange": None,
        "payment": "88123",
        "client_transfer_id": "my-id-1",
        "message": "lunch",
        "errorMessage": None,
    }
}


class TransferCreateApi(GatewayApi):
    """Send funds to another account by e-mail or phone number. Answers JSON for every outcome.
    The key needs Enable Fiat for a fiat asset, Enable Crypto Wallet for crypto (-2019)."""

    security = Security.USER_DATA
    ip_weight = 50
    uid_weight = 50
    api_version = "v4"
    params_spec = ParamSpec(
        (
            Param("client_transfer_id", max_length=100, description="Unique per sender; a repeat is refused."),
            Param("account", required=True, max_length=16, description="The asset, e.g. PHP or BTC."),
            Param("target_address", required=True, max_length=254, description="Recipient phone number or e-mail."),
            Param("amount", "DECIMAL", required=True),
            Param("message", max_length=255, description="Text sent to the recipient."),
        )
    )
    response_example = _CREATED_EXAMPLE

    def post(self, request):
        p = self.params
        policy.require_fund_key(self, p["account"])
        transfer = services.transfer_create(
            sender=self.account,
            asset_code=p["account"],
            target_address=p["target_address"],
            amount=p["amount"],
            message=p["message"] or "",
            client_transfer_id=p["client_transfer_id"],
            api_version=self.api_version,
        )
        return Response({"transfer": presenters.created_json(transfer)})


class TransferQueryApi(GatewayApi):
    """One transfer by id (or client_transfer_id), or the caller's transfers, oldest first."""

    http_method_names = ["get", "head"]
    security = Security.USER_DATA
    ip_weight = 10
    uid_weight = 10
    params_spec = ParamSpec(
        (
            Param("id", max_length=32),
            Param("client_transfer_id", max_length=100),
            Param("page", "INT", default=1, min=1),
            Param("per_page", "INT", default=2000, min=1, max=2000),
            Param("from_address", max_length=254),
            Param("to_address", max_length=254),
        ),
        conflicts=(("from_address", "to_address"),),
    )
    response_example = {
        "transfers": [
            {
                "id": "2001",
                "client_transfer_id": "my-id-1",
                "account": "PHP",
                "amount": "150.00",
                "fee_amount": "0.00",
                "currency": "PHP",
                "payment": "88123",
                "status": "success",
                "message": "lunch",
                "target_address": "friend@example.com",
                "sourceAddress": "me@example.com",
                "source_address": "me@example.com",
                "type": 2,
                "created_at": "2026-11-22T08:00:00.000Z",
            }
        ],
        "meta": {"total_count": 1, "next_page": None, "previous_page": None},
    }

    def get(self, request, transfer_id: str | None = None):
        p = self.params
        transfer_id = transfer_id or p["id"]
        if transfer_id is not None:  # id wins over client_transfer_id
            transfer = selectors.transfer_get(user=self.account, transfer_id=transfer_id)
            if transfer is None:
                raise NotFound(f"transfer {transfer_id}")
            return Response({"transfer": presenters.transfer_json(transfer, viewer=self.account)})
        check_skip("page", (p["page"] - 1) * p["per_page"])
        from_user = to_user = None
        if p["from_address"] is not None:
            from_user = user_get_by_address(address=p["from_address"])
        if p["to_address"] is not None:
            to_user = user_get_by_address(address=p["to_address"])
        if (p["from_address"] is not None and from_user is None) or (p["to_address"] is not None and to_user is None):
            return Response(presenters.transfer_list_json(selectors.NO_TRANSFERS, viewer=self.account))
        page = selectors.transfer_list(
            user=self.account,
            page=p["page"],
            per_page=p["per_page"],
            client_transfer_id=p["client_transfer_id"],
            from_user=from_user,
            to_user=to_user,
        )
        return Response(presenters.transfer_list_json(page, viewer=self.account))


class V3TransfersApi(TransferQueryApi):
    """GET lists the caller's transfers; POST is the legacy (v3) creation, with the same rules and
    payload as v4."""

    http_method_names = ["get", "post", "head"]
    per_method = {
        "POST": {
            "ip_weight": TransferCreateApi.ip_weight,
            "uid_weight": TransferCreateApi.uid_weight,
            "response_example": _CREATED_EXAMPLE,
        }
    }
    params_spec = {
        "GET": TransferQueryApi.params_spec,
        "HEAD": TransferQueryApi.params_spec,
        "POST": TransferCreateApi.params_spec,
    }

    def post(self, request):
        return TransferCreateApi.post(self, request)

    api_version = "v3"
