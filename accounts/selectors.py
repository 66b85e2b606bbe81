from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import F, Max, Sum

from accounts.keyring import keyrings
from accounts.ledger.posting import fetch_prepared
from accounts.limits import (
    SNAPSHOT_COLUMNS,
    SNAPSHOT_JOINS,
    LimitSnapshot,
    limit_blocks,
    snapshot_from_rows,
    snapshot_join_params,
)
from accounts.models import Asset, Balance, Entry, User
from exchange.api import formatting as fmt


def api_key_list(*, user: User) -> list[dict]:
    """The caller's keys as GET /openapi/v1/api-keys shows them (from the keyring the gateway
    already holds for this account: same rows, same invalidation)."""
    keyring = keyrings.for_user(user.pk)
    return [
        {
            "apiKey": key.key,
            "apiName": key.name,
            "apiType": list(key.types),
            "status": key.status,
            "createTime": str(key.created_at_ms),
            "ipAccessRestrictions": list(key.ip_list) if key.ip_restrict else [],
        }
        for key in (keyring.keys if keyring else ())
    ]


def _address_key(address: str) -> tuple[str, str]:
    """The column and value a recipient address is found by: an e-mail (any case) or a phone number."""
    address = address.strip()
    return ("email", address.lower()) if "@" in address else ("phone", address)


def user_get_by_address(*, address: str) -> User | None:
    """A user by e-mail (case-insensitive) or phone number."""
    column, value = _address_key(address)
    return User.objects.filter(**{column: value}).first()


@dataclass(frozen=True)
class UserRef:
    id: int
    system_role: str | None
    is_active: bool
    is_frozen: bool


def transfer_parties(*, sender_id: int, address: str) -> tuple[UserRef | None, LimitSnapshot]:
    """The recipient of a transfer (found as user_get_by_address finds the user) and the sender's
    limit snapshot (accounts.limits.LimitSnapshot), in one prepared statement: one round trip."""
    column, value = _address_key(address)
    match = (  # e-mails are unique; a phone number may not be: then the first, as .first() takes it
        "r.email = %s" if column == "email" else "r.id = (SELECT id FROM accounts_user WHERE phone = %s LIMIT 1)"
    )
    rows = fetch_prepared(  # the f-string joins this module's constant SQL; values are parameters
        f"SELECT r.id, r.system_role, r.is_active, r.is_frozen, {SNAPSHOT_COLUMNS}"  # noqa: S608
        " FROM (SELECT CAST(%s AS bigint) AS id) s"
        f" LEFT JOIN accounts_user r ON {match}"
        f" LEFT JOIN accounts_ledgeraccount la ON la.user_id = s.id{SNAPSHOT_JOINS}",
        [sender_id, value, *snapshot_join_params()],
    )
    first = rows[0]  # the outer query always gives a row
    recipient = UserRef(first[0], first[1], bool(first[2]), bool(first[3])) if first[0] is not None else None
    return recipient, snapshot_from_rows([row[4:] for row in rows] if first[4] is not None else [])


# --- balances, account information, history ---------------------------------------------------

ACCOUNT_TYPE = "SPOT"


def _limit_block_json(block) -> dict | None:
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


def balance_rows(*, user: User) -> list[tuple[Asset, Decimal, Decimal]]:
    """Every asset with the account's free and locked (zero where it has none)."""
    held = {b.asset_id: b for b in Balance.objects.filter(account=user)}
    rows = []
    for asset in Asset.objects.order_by("code"):
        balance = held.get(asset.id)
        rows.append((asset, balance.free if balance else Decimal(0), balance.locked if balance else Decimal(0)))
    return rows


def account_info(*, user: User) -> dict:
    blocks = limit_blocks(user)
    last_change = Balance.objects.filter(account=user).aggregate(latest=Max("updated_at"))["latest"]
    return {
        "canTrade": user.can_trade,
        "canDeposit": user.can_deposit,
        "canWithdraw": user.can_withdraw,
        "accountType": ACCOUNT_TYPE,
        "updateTime": fmt.millis(last_change or user.date_joined),
        "balances": [
            {
                "asset": asset.code,
                "free": fmt.amount(free, asset.transfer_precision),
                "locked": fmt.amount(locked, asset.transfer_precision),
            }
            for asset, free, locked in balance_rows(user=user)
        ],
        "token": user.base_token,
        "email": user.email,
        "enableWithdrawWhitelist": user.enable_withdraw_whitelist,
        **{period: _limit_block_json(block) for period, block in blocks.items()},
    }


def crypto_accounts(*, user: User, currency: str | None = None) -> list[dict]:
    return [
        {
            "id": f"{user.pk}-{asset.code}",
            "name": asset.name,
            "currency": asset.code,
            "balance": fmt.amount(free, asset.transfer_precision),
            "pending_balance": fmt.amount(locked, asset.transfer_precision),
        }
        for asset, free, locked in balance_rows(user=user)
        if currency is None or asset.code == currency
    ]


def transaction_history(*, user: User, asset: Asset, start: datetime, end: datetime, page: int, size: int) -> dict:
    """The account's postings in `asset` within [start, end], oldest first, with their signed net
    change (a hold from free to locked changes nothing and is not listed)."""
    offset = (page - 1) * size
    entries = Entry.objects.filter(
        account=user, asset=asset, posting__created_at__gte=start, posting__created_at__lte=end
    )
    if connection.vendor == "postgresql":
        rows = list(
            entries.values("posting_id", "posting__kind", "posting__created_at")
            .annotate(changed=Sum(F("side") * F("amount")))
            .exclude(changed=0)
            .order_by("posting_id")[offset : offset + size + 1]
        )
    else:  # SQLite sums NUMERIC columns as floating point: add the Decimals here (embedded mode)
        grouped: dict[int, dict] = {}
        for posting_id, kind, created, side, amount in entries.order_by("posting_id").values_list(
            "posting_id", "posting__kind", "posting__created_at", "side", "amount"
        ):
            row = grouped.setdefault(
                posting_id,
                {
                    "posting_id": posting_id,
                    "posting__kind": kind,
                    "posting__created_at": created,
                    "changed": Decimal(0),
                },
            )
            row["changed"] += side * amount
        rows = [row for row in grouped.values() if row["changed"] != 0][offset : offset + size + 1]
    has_next = len(rows) > size
    meta: dict = {"has_next": has_next}
    if has_next:
        meta["next_page"] = page + 1
    if page > 1:
        meta["previous_page"] = page - 1
    return {
        "transactions": [
            {
                "txId": str(row["posting_id"]),
                "bizSubject": row["posting__kind"],
                "status": "SUCCESS",
                "changed": fmt.amount(row["changed"], asset.transfer_precision),
                "tokenId": asset.code,
                "time": str(fmt.millis(row["posting__created_at"])),
            }
            for row in rows[:size]
        ],
        "meta": meta,
    }
