"""Account reads as the spec renders them: its field names, amounts as decimal strings (an asset's
transfer precision; limits in 2 places), times in ms (as a number or a string, as each endpoint
has them). The selectors return models, Decimals and datetimes; only the API layer calls these."""

from __future__ import annotations

from accounts.keyring import KeyRecord
from accounts.limits import LimitBlock
from accounts.selectors import AccountInfo, AssetBalance, HistoryPage
from exchange.api import formatting as fmt

ACCOUNT_TYPE = "SPOT"


def api_key_json(key: KeyRecord) -> dict:
    return {
        "apiKey": key.key,
        "apiName": key.name,
        "apiType": list(key.types),
        "status": key.status,
        "createTime": str(key.created_at_ms),
        "ipAccessRestrictions": list(key.ip_list) if key.ip_restrict else [],
    }


def limit_block_json(block: LimitBlock | None) -> dict | None:
    if block is None:
        return None
    return {
        "cashInLimit": fmt.amount(block.cash_in_limit, 2),
        "cashInRemaining": fmt.amount(block.cash_in_remaining, 2),
        "cashOutLimit": fmt.amount(block.cash_out_limit, 2),
        "cashOutRemaining": fmt.amount(block.cash_out_remaining, 2),
        "totalWithdrawLimit": fmt.amount(block.total_withdraw_limit, 2),
        "totalWithdrawRemaining": fmt.amount(block.total_withdraw_remaining, 2),
    }


def account_info_json(info: AccountInfo) -> dict:
    user = info.user
    return {
        "canTrade": user.can_trade,
        "canDeposit": user.can_deposit,
        "canWithdraw": user.can_withdraw,
        "accountType": ACCOUNT_TYPE,
        "updateTime": fmt.millis(info.updated_at),
        "balances": [
            {
                "asset": asset.code,
                "free": fmt.amount(free, asset.transfer_precision),
                "locked": fmt.amount(locked, asset.transfer_precision),
            }
            for asset, free, locked in info.balances
        ],
        "token": user.base_token,
        "email": user.email,
        "enableWithdrawWhitelist": user.enable_withdraw_whitelist,
        **{period: limit_block_json(block) for period, block in info.limits.items()},
    }


def crypto_accounts_json(balances: list[AssetBalance], *, account_id: int) -> dict:
    return {
        "crypto-accounts": [
            {
                "id": f"{account_id}-{asset.code}",
                "name": asset.name,
                "currency": asset.code,
                "balance": fmt.amount(free, asset.transfer_precision),
                "pending_balance": fmt.amount(locked, asset.transfer_precision),
            }
            for asset, free, locked in balances
        ]
    }


def transaction_history_json(page: HistoryPage) -> dict:
    asset = page.asset
    meta: dict = {"has_next": page.has_next}
    if page.has_next:
        meta["next_page"] = page.page + 1
    if page.page > 1:
        meta["previous_page"] = page.page - 1
    return {
        "transactions": [
            {
                "txId": str(row.posting_id),
                "bizSubject": row.kind,
                "status": "SUCCESS",
                "changed": fmt.amount(row.changed, asset.transfer_precision),
                "tokenId": asset.code,
                "time": str(fmt.millis(row.created_at)),
            }
            for row in page.rows
        ],
        "meta": meta,
    }
