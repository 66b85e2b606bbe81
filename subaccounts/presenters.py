"""The spec's JSON of sub-accounts, their balances and their transfers."""

from __future__ import annotations

from accounts.models import ApiKey, ApiKeyType, User, family_email
from accounts.selectors import AssetBalance
from exchange.api import formatting as fmt
from subaccounts.models import FundCollection, SubAccountTransfer


def sub_account_json(sub: User, *, create_time_as_text: bool) -> dict:
    """The spec's Sub-account record: createTime a string in list answers, an integer on creation."""
    created = fmt.millis(sub.date_joined)
    return {
        "email": family_email(sub.email, sub.requested_email),
        "createTime": str(created) if create_time_as_text else created,
        "isFreeze": sub.is_frozen,
    }


def sub_account_list_json(sub_accounts: list[User], total: int) -> dict:
    return {"subAccounts": [sub_account_json(s, create_time_as_text=True) for s in sub_accounts], "total": total}


def balances_json(balances: list[AssetBalance]) -> dict:
    return {
        "balances": [
            {
                "asset": asset.code,
                "free": fmt.amount(free, asset.transfer_precision),
                "locked": fmt.amount(locked, asset.transfer_precision),
            }
            for asset, free, locked in balances
        ]
    }


def transfer_result_json(transfer: SubAccountTransfer) -> dict:
    return {"clientTransferId": transfer.client_tran_id, "result": transfer.status == "success"}


def transfer_json(transfer: SubAccountTransfer) -> dict:
    """The spec's sub-account transfer record."""
    return {
        "clientTranId": transfer.client_tran_id,
        "fromEmail": family_email(transfer.from_account.email, transfer.from_account.requested_email),
        "toEmail": family_email(transfer.to_account.email, transfer.to_account.requested_email),
        "asset": transfer.asset.code,
        "amount": fmt.amount(transfer.amount, transfer.asset.transfer_precision),
        "createdAt": fmt.millis(transfer.created_at),
        "status": transfer.status,
    }


def transfer_history_json(transfers: list[SubAccountTransfer], total: int) -> dict:
    return {"result": [transfer_json(t) for t in transfers], "total": total}


# The spec's role codes of an API key's types (the IP restriction record's `role`).
ROLE_CODES = {
    ApiKeyType.READ_ONLY: 0,
    ApiKeyType.SPOT: 2,  # TRADE_ONLY
    ApiKeyType.CONVERT: 3,
    ApiKeyType.CRYPTO_WALLET: 4,
    ApiKeyType.FIAT: 5,
    ApiKeyType.ACCOUNT: 6,
}


def ip_restriction_json(api_key: ApiKey) -> dict:
    """The spec's Sub-account API key IP restriction record."""
    return {
        "apikey": api_key.key,
        "ipList": list(api_key.ip_list),
        "ipRestrict": api_key.ip_restrict,
        "role": ",".join(str(code) for code in sorted({ROLE_CODES[t] for t in api_key.types if t in ROLE_CODES})),
        "updateTime": fmt.millis(api_key.updated_at),
    }


def collection_json(collection: FundCollection) -> dict:
    """The spec's Collection task: the collect call's answer."""
    return {"clientRequestId": collection.client_request_id, "status": collection.status, "comment": collection.comment}


def collection_records_json(collections: list[FundCollection]) -> list[dict]:
    """get-fund-record: a bare array (the spec's shape), each in the order the spec lists its fields."""
    return [{"clientRequestId": c.client_request_id, "comment": c.comment, "status": c.status} for c in collections]
