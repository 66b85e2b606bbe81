"""Convert reads: model instances and Decimals, for the API (convert/presenters.py), the admin and tasks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from accounts import ledger
from accounts.ledger.models import Balance
from accounts.models import SystemRole
from convert.models import Market, Order, Pair
from exchange.runtime import replicas


def pairs_enabled() -> list[Pair]:
    return list(Pair.objects.select_related("source", "target").filter(enabled=True).order_by("pk"))


@dataclass(frozen=True)
class OrderPage:
    orders: list[Order]
    total: int


def order_history(
    *,
    user_id: int,
    start: datetime | None = None,
    end: datetime | None = None,
    status: str | None = None,
    page: int = 1,
    size: int = 10,
) -> OrderPage:
    """The account's orders, oldest first; `total` counts every order the filters match. May come from
    the replica (exchange/runtime/replicas.py): an account that just accepted a quote reads the primary."""

    def read(alias: str) -> OrderPage:
        return _order_page(alias, user_id, start, end, status, page, size)

    return replicas.history_read(read, account_ids=[user_id])


def _order_page(alias, user_id, start, end, status, page, size) -> OrderPage:
    orders = Order.objects.using(alias).filter(user_id=user_id)
    if start is not None:
        orders = orders.filter(created_at__gte=start)
    if end is not None:
        orders = orders.filter(created_at__lte=end)
    if status is not None:
        orders = orders.filter(status=status)
    total = orders.count()
    offset = (page - 1) * size
    rows = list(
        orders.select_related("pair__source", "pair__target", "quote").order_by("created_at", "id")[
            offset : offset + size
        ]
    )
    return OrderPage(rows, total)


def liquidity_by_asset() -> dict[str, Decimal]:
    """What the house holds for conversions, per asset code (free, summed over the shards)."""
    shards = ledger.role_account_ids(SystemRole.CONVERT_LIQUIDITY)
    rows = (
        Balance.objects.filter(account_id__in=shards)
        .values("asset__code")
        .annotate(free=Sum("free"))
        .order_by("asset__code")
    )
    return {row["asset__code"]: row["free"] for row in rows}


def markets_listed() -> list[Market]:
    """The markets customers can convert in (at least one enabled pair), by base then quote code:
    the symbols of GET /openapi/v1/exchangeInfo."""
    return list(
        Market.objects.select_related("base", "quote")
        .filter(pairs__enabled=True)
        .distinct()
        .order_by("base__code", "quote__code")
    )
