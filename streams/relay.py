"""The relay: change-feed rows to the websocket consumers, at least once and in order.

- Fast path: right after a posting commits, the committing process sends its rows to the account's
  group (and to its master's, when the master is whitelisted) and marks them published. It does so
  only where the channel layer is shared (Redis) or in the server process itself: the embedded
  in-memory layer exists in one process, so another process (`manage.py deposit`) leaves its rows
  to the server.
- Sweeper: an asyncio task in each server process publishes rows still unpublished after
  STREAM_SWEEP_GRACE_SECONDS (a process that crashed between commit and publish, or another
  process in the embedded default).
- Order: every row carries its per-account sequence; a consumer drops what it has already sent and
  fills any gap from the database before going on, so duplicates and reordering between the two
  paths never reach a client.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from accounts.ledger.models import Asset, BalanceChange
from accounts.ledger.posting import PostingResult
from accounts.models import LedgerAccount, User
from exchange.api import formatting as fmt
from streams.events import row_payload

logger = logging.getLogger(__name__)
_server_process = False


def account_group(account_id: int) -> str:
    return f"streams.acct.{account_id}"


def mark_server_process() -> None:
    """Called by the ASGI application: this process holds the websockets."""
    global _server_process
    _server_process = True


def fast_path_enabled() -> bool:
    layer = get_channel_layer()
    return layer is not None and (_server_process or not isinstance(layer, InMemoryChannelLayer))


def _precisions(codes) -> dict[str, int]:
    return dict(Asset.objects.filter(code__in=set(codes)).values_list("code", "transfer_precision"))


def _audiences(account_ids) -> dict[int, tuple[str, list[int]]]:
    """Per account: its e-mail and the groups its events go to (its own; its master's when the
    master is whitelisted)."""
    rows = User.objects.filter(pk__in=set(account_ids)).values_list(
        "pk", "email", "master_id", "master__is_whitelisted_master"
    )
    return {pk: (email, [pk] + ([master] if master and whitelisted else [])) for pk, email, master, whitelisted in rows}


def messages_for(rows_by_account: dict[int, list[dict]]) -> list[tuple[str, dict]]:
    audiences = _audiences(rows_by_account)
    messages = []
    for account, rows in rows_by_account.items():
        email, groups = audiences.get(account, ("", [account]))
        message = {"type": "ledger.changes", "account": account, "email": email, "rows": rows}
        messages.extend((account_group(group), message) for group in groups)
    return messages


def publish_posting(result: PostingResult) -> None:
    """The fast path (a ledger after-commit listener)."""
    if not fast_path_enabled():
        return
    try:
        precision = _precisions(b.asset for b in result.balances)
        created_ms = fmt.millis(result.created_at)
        by_account: dict[int, list[dict]] = defaultdict(list)
        for b in sorted(result.balances, key=lambda b: (b.account_id, b.seq)):
            by_account[b.account_id].append(
                row_payload(
                    seq=b.seq,
                    asset=b.asset,
                    precision=precision.get(b.asset, 8),
                    delta_free=b.delta_free,
                    delta_locked=b.delta_locked,
                    free=b.free,
                    locked=b.locked,
                    kind=result.kind,
                    posting_id=result.posting_id,
                    created_ms=created_ms,
                )
            )
        layer = get_channel_layer()
        for group, message in messages_for(by_account):
            async_to_sync(layer.group_send)(group, message)
        BalanceChange.objects.filter(posting_id=result.posting_id, published_at__isnull=True).update(
            published_at=timezone.now()
        )
    except Exception:
        # The rows stay unpublished; the sweeper will deliver them.
        logger.exception("Fast-path publish of posting %s failed", result.posting_id)


# --- reading the change feed -------------------------------------------------------------------


def _payload(change: BalanceChange, precision: dict[str, int]) -> dict:
    return row_payload(
        seq=change.seq,
        asset=change.asset.code,
        precision=precision.get(change.asset.code, 8),
        delta_free=change.delta_free,
        delta_locked=change.delta_locked,
        free=change.free_after,
        locked=change.locked_after,
        kind=change.kind,
        posting_id=change.posting_id,
        created_ms=fmt.millis(change.created_at),
    )


def rows_between(account_id: int, first_seq: int, last_seq: int) -> list[dict]:
    """Gap fill for a consumer: the account's rows with first_seq <= seq <= last_seq."""
    changes = list(
        BalanceChange.objects.select_related("asset")
        .filter(account_id=account_id, seq__gte=first_seq, seq__lte=last_seq)
        .order_by("seq")
    )
    precision = _precisions(c.asset.code for c in changes)
    return [_payload(c, precision) for c in changes]


def current_seqs(account_ids) -> dict[int, int]:
    return dict(LedgerAccount.objects.filter(user_id__in=set(account_ids)).values_list("user_id", "seq"))


def unpublished(grace_seconds: float, limit: int = 2000) -> tuple[list[int], list[tuple[str, dict]]]:
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    changes = list(
        BalanceChange.objects.select_related("asset")
        .filter(published_at__isnull=True, created_at__lte=cutoff)
        .order_by("id")[:limit]
    )
    if not changes:
        return [], []
    precision = _precisions(c.asset.code for c in changes)
    by_account: dict[int, list[dict]] = defaultdict(list)
    for change in sorted(changes, key=lambda c: (c.account_id, c.seq)):
        by_account[change.account_id].append(_payload(change, precision))
    return [c.pk for c in changes], messages_for(by_account)


def mark_published(ids: list[int]) -> None:
    BalanceChange.objects.filter(pk__in=ids, published_at__isnull=True).update(published_at=timezone.now())


# --- the sweeper ---------------------------------------------------------------------------------

_sweeper: asyncio.Task | None = None


async def sweep_once(grace_seconds: float | None = None) -> int:
    grace = settings.STREAM_SWEEP_GRACE_SECONDS if grace_seconds is None else grace_seconds
    ids, messages = await database_sync_to_async(unpublished)(grace)
    layer = get_channel_layer()
    for group, message in messages:
        await layer.group_send(group, message)
    if ids:
        await database_sync_to_async(mark_published)(ids)
    return len(ids)


async def _sweep_forever() -> None:
    while True:
        try:
            await sweep_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Relay sweep failed; retrying")
            await database_sync_to_async(close_old_connections)()
        await asyncio.sleep(settings.STREAM_SWEEP_SECONDS)


def ensure_sweeper() -> None:
    """Start this process's sweeper in the running event loop (once)."""
    global _sweeper
    if not settings.STREAM_SWEEPER_ENABLED:
        return
    if _sweeper is None or _sweeper.done():
        _sweeper = asyncio.get_running_loop().create_task(_sweep_forever())
