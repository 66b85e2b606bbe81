"""The spec's JSON of sub-accounts, their balances and their transfers."""

from __future__ import annotations

from accounts.models import User
from accounts.selectors import AssetBalance
from exchange.api import formatting as fmt
from subaccounts.models import SubAccountTransfer


def sub_account_json(sub: User, *, create_time_as_text: bool) -> dict:
    """The spec's Sub-account record: createTime a string in list answers, an integer on creation."""
    created = fmt.millis(sub.date_joined)
    return {
        "email": sub.email,
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
        "fromEmail": transfer.from_account.email,
        "toEmail": transfer.to_account.email,
        "asset": transfer.asset.code,
        "amount": fmt.amount(transfer.amount, transfer.asset.transfer_precision),
        "createdAt": fmt.millis(transfer.created_at),
        "status": transfer.status,
    }


def transfer_history_json(transfers: list[SubAccountTransfer], total: int) -> dict:
    return {"result": [transfer_json(t) for t in transfers], "total": total}
