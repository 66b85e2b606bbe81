"""Reads for the websocket consumer."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q

from accounts.models import ApiKey, ApiKeyStatus, User
from streams.models import ListenKey, ListenKeyHolder
from streams.store import store


def listen_key_owners(keys: list[str]) -> dict[str, int | None]:
    """The account of each key that may be streamed now, None for the others. A key may not be
    streamed when it is dead in the store; and also (defence in depth, should a revocation not have
    reached the store) when its record is closed, its account is inactive, frozen or gone, or one of
    the API keys it was handed is disabled or deleted. One MGET and at most two queries for them all."""
    owners = store().owners(keys)
    alive = {key: account for key, account in owners.items() if account is not None}
    if not alive:
        return owners
    allowed = set(
        User.objects.filter(pk__in=set(alive.values()), is_active=True, is_frozen=False).values_list("pk", flat=True)
    )
    enabled = ApiKey.objects.filter(key=OuterRef("api_key"), status=ApiKeyStatus.ENABLE)
    revoked_holder = ListenKeyHolder.objects.filter(listen_key_id=OuterRef("key")).exclude(Exists(enabled))
    refused = set(
        ListenKey.objects.filter(key__in=list(alive))
        .filter(Q(closed_at__isnull=False) | Exists(revoked_holder))
        .values_list("key", flat=True)
    )
    return {key: account if account in allowed and key not in refused else None for key, account in owners.items()}
