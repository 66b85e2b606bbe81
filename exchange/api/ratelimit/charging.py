"""`charge()`: the gateway's one call per request. It takes the weights (and a signed write's
signature) in one storage round trip, refuses a banned IP (418), a request over a limit (429, then
a ban), a replayed or too-early signature, and sets the used-weight headers."""

from __future__ import annotations

import math
import time

from exchange.api.errors import (
    IpBanned,
    ReplayCheckUnavailable,
    SignatureReplayed,
    TimestampBeforeReplayMemory,
    TooManyRequests,
)
from exchange.api.ratelimit.bans import ban_key, rate_limit_ban_create, warned_key
from exchange.api.ratelimit.storage import STORAGE_ERRORS, STORAGE_OUTAGE, counters, limit_item

# The least IP weight of a request refused before its caller is known (a failed authentication, an
# unknown path, a malformed request), whatever the endpoint's own weights: such a request is never
# free, even where a known caller pays by UID only (IP weight 0).
REFUSAL_WEIGHT = 1

USED_WEIGHT_HEADER = "X-SERVICE-USED-WEIGHT-1M"
USED_UID_WEIGHT_HEADER = "X-SERVICE-USED-UID-WEIGHT-1M"


def apply_weight_headers(request, response) -> None:
    http_request = getattr(request, "_request", request)
    used = getattr(http_request, "_used_weight", None)
    if used is None:
        return
    if used.get("ip") is not None:
        response[USED_WEIGHT_HEADER] = str(used["ip"])
    if used.get("uid") is not None:
        response[USED_UID_WEIGHT_HEADER] = str(used["uid"])


def signature_key(api_key: str, signature: str) -> str:
    return f"exchange/signature/{api_key}/{signature}"


def charge(
    http_request,
    *,
    ip: str,
    ip_weight: int,
    uid: int | None = None,
    uid_weight: int = 0,
    signature: tuple[str, str, int, int] | None = None,
) -> None:
    """Refuse a banned IP (418); add the weights to the IP and UID counters; refuse over a limit
    (429, and 418 with a new ban for a client that continues after its 429); then, for a signed
    write (`signature` = (api key, lower-case signature, seconds it stays valid, its timestamp)),
    refuse a signature used before (-1022) or signed before the storage's memory epoch (-1021), or
    remember it. One storage round trip; a signed write is refused (-1001) when the storage cannot
    be reached.

    Call it with a signature only once the request has passed every other check of the gateway:
    a request refused for its signature, timing, key or IP must not spend its signature."""
    ip_item = limit_item("ip")
    uid_item = limit_item("uid") if uid is not None else None
    try:
        taken = counters().take(
            ban_key(ip),
            ip_item.key_for(ip),
            ip_weight,
            uid_item.key_for(str(uid)) if uid_item else None,
            uid_weight,
            ip_item.get_expiry(),
            ip_limit=ip_item.amount,
            uid_limit=uid_item.amount if uid_item else 0,
            signature_key=signature_key(signature[0], signature[1]) if signature else None,
            signature_seconds=signature[2] if signature else 0,
            signed_at_ms=signature[3] if signature else 0,
        )
    except STORAGE_ERRORS as exc:
        # Limits protect capacity, not money: an outage of their storage must not stop reads. A
        # signed write moves or changes something: without the replay check it could be run twice.
        STORAGE_OUTAGE.failed(exc)
        if signature:
            raise ReplayCheckUnavailable() from exc
        return
    STORAGE_OUTAGE.ok()
    if taken.ban_ms:
        _refuse_banned(taken.ban_ms / 1000)
    used = http_request.__dict__.setdefault("_used_weight", {})
    used["ip"] = taken.ip
    if taken.uid is not None:
        used["uid"] = taken.uid
    if taken.ip > ip_item.amount:
        _over_limit(ip, "ip", taken.ip, ip_item.amount, taken.ip_ms)
    if taken.replayed == 1:
        raise SignatureReplayed()
    if taken.replayed == 2:
        raise TimestampBeforeReplayMemory()
    if uid_item is not None and taken.uid > uid_item.amount:
        _over_limit(ip, "uid", taken.uid, uid_item.amount, taken.uid_ms)


def _refuse_banned(seconds_left: float) -> None:
    retry_after = max(1, math.ceil(seconds_left))
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + retry_after))
    raise IpBanned(until, headers={"Retry-After": str(retry_after)})


def _over_limit(ip: str, counter: str, count: int, limit: int, window_ms: int) -> None:
    retry_after = max(1, math.ceil(window_ms / 1000))
    try:
        warned = counters().incr(warned_key(ip), retry_after)
    except STORAGE_ERRORS:
        warned = 1
    if warned == 1:
        raise TooManyRequests(limit, "1 minute", headers={"Retry-After": str(retry_after)})
    if warned == 2:  # exactly one request per window creates the ban
        ban = rate_limit_ban_create(ip=ip, reason=f"continued after 429 on the {counter} limit ({count}/{limit})")
        _refuse_banned(ban.duration_seconds)
    _refuse_banned(retry_after)  # the ban is being recorded by a concurrent request
