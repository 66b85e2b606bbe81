"""The change feed as the relay reads it: the messages it sends (an account's group, the audience of
its events, the rows' payloads), the rows a hub fills a gap with, the rows nobody published,
and marking rows published."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

from django.db import connection as db_connection
from django.utils import timezone

from accounts.ledger.models import Asset, BalanceChange
from accounts.models import LedgerAccount, User, family_email
from exchange.api import formatting as fmt
from streams import clock
from streams.events import row_payload

Messages = list[tuple[str, dict]]  # (group, message) in the order they must be sent

_precision_cache: dict[str, int] = {}
_audience_cache: dict[int, tuple[float, str, list[int]]] = {}
AUDIENCE_TTL_SECONDS = 5.0


def account_group(account_id: int) -> str:
    return f"streams.acct.{account_id}"


def asset_precisions(codes) -> dict[str, int]:
    """The transfer precision of each asset code (8 for an unknown one); cached for the process."""
    codes = set(codes)
    missing = codes - _precision_cache.keys()
    if missing:
        _precision_cache.update(Asset.objects.filter(code__in=missing).values_list("code", "transfer_precision"))
    return {code: _precision_cache.get(code, 8) for code in codes}


def _audiences(account_ids) -> dict[int, tuple[str, list[int]]]:
    """Per account: its e-mail and the groups its events go to (its own; its master's when the
    master is whitelisted). Cached a few seconds: an operator's change of the whitelisted flag
    reaches the stream within AUDIENCE_TTL_SECONDS."""
    now = time.monotonic()
    wanted = set(account_ids)
    stale = {a for a in wanted if a not in _audience_cache or _audience_cache[a][0] < now}
    if stale:
        rows = User.objects.filter(pk__in=stale).values_list(
            "pk", "email", "requested_email", "master_id", "master__is_whitelisted_master"
        )
        for pk, email, requested_email, master, whitelisted in rows:
            _audience_cache[pk] = (
                now + AUDIENCE_TTL_SECONDS,
                family_email(email, requested_email),  # `em`, as the master named the sub-account
                [pk] + ([master] if master and whitelisted else []),
            )
    return {a: (_audience_cache[a][1], _audience_cache[a][2]) for a in wanted if a in _audience_cache}


def messages_for(rows_by_account: dict[int, list[dict]]) -> Messages:
    """One `ledger.changes` message per account and group of its audience, carrying its rows."""
    audiences = _audiences(rows_by_account)
    messages = []
    # "sent", on Redis's clock (streams/clock.py): a hub that receives it more than
    # STREAM_MAX_LAG_SECONDS later is behind (hub/fairness.py), whatever the two hosts' own clocks say.
    sent = clock.publisher.now_synced()
    for account, rows in rows_by_account.items():
        email, groups = audiences.get(account, ("", [account]))
        message = {"type": "ledger.changes", "account": account, "email": email, "rows": rows, "sent": sent}
        messages.extend((account_group(group), message) for group in groups)
    return messages


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
    """Gap fill (and catch-up, replay) for a hub: the account's rows with first_seq <= seq <= last_seq."""
    changes = list(
        BalanceChange.objects.select_related("asset")
        .filter(account_id=account_id, seq__gte=first_seq, seq__lte=last_seq)
        .order_by("seq")
    )
    precision = asset_precisions(c.asset.code for c in changes)
    return [_payload(c, precision) for c in changes]


def current_seqs(account_ids) -> dict[int, int]:
    return dict(LedgerAccount.objects.filter(user_id__in=set(account_ids)).values_list("user_id", "seq"))


def unpublished(grace_seconds: float, limit: int = 2000) -> tuple[list[int], Messages]:
    """The oldest rows unpublished for `grace_seconds` (ids) and their messages."""
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    changes = list(
        BalanceChange.objects.select_related("asset")
        .filter(published_at__isnull=True, created_at__lte=cutoff)
        .order_by("id")[:limit]
    )
    if not changes:
        return [], []
    precision = asset_precisions(c.asset.code for c in changes)
    by_account: dict[int, list[dict]] = defaultdict(list)
    for change in sorted(changes, key=lambda c: (c.account_id, c.seq)):
        by_account[change.account_id].append(_payload(change, precision))
    return [c.pk for c in changes], messages_for(by_account)


def mark_published(ids: list[int]) -> None:
    """The sweeper's mark: rows by id."""
    BalanceChange.objects.filter(pk__in=ids, published_at__isnull=True).update(published_at=timezone.now())


def mark_postings_published(posting_ids: list[int]) -> None:
    """The fast path's mark: every row of the postings, in one statement for any number of postings
    (the ORM's query building cost more than the database's work here). A row published before (by
    the sweeper) keeps its time. The rows are found by posting id only: written as `published_at IS
    NULL`, the condition let PostgreSQL combine the posting index with the partial index of
    unpublished rows, whose entries for rows published since the last vacuum a bitmap scan walks
    every time (16,000 of them, 1 ms per batch, under bench/transfers)."""
    table = BalanceChange._meta.db_table
    with db_connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET published_at = %s WHERE posting_id IN ({', '.join(['%s'] * len(posting_ids))})"  # noqa: S608
            " AND coalesce(published_at, 'infinity') = 'infinity'",
            [db_connection.ops.adapt_datetimefield_value(timezone.now()), *posting_ids],
        )
