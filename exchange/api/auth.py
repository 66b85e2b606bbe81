"""Signed-request authentication: key, signature, timing, key status, key type, IP list.

totalParams is the raw query string immediately followed by the raw body, with the `signature`
pair removed. The signature is the hex HMAC-SHA256 of totalParams keyed with the secret; it is
compared case-insensitively in constant time. The official clients sign the percent-decoded text
(an e-mail's `@` signed as `@`, sent as `%40`), so that text is accepted too, but only when
decoding cannot change how the text splits into parameters: otherwise a captured request could be
re-encoded to merge parameters (`a=1%26b%3D2` decodes to the text of `a=1&b=2`).
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import unquote, unquote_plus

from exchange.api.errors import (
    AccountFrozen,
    ApiKeyNotEnabled,
    ApiKeyNotExist,
    ApiKeyTypeWrong,
    BindIpWhiteListFirst,
    InvalidSignature,
    IpNotInWhitelist,
    TimestampAhead,
    TimestampBehind,
    Unauthorized,
    UnsupportedOperation,
)
from exchange.api.params import RECV_WINDOW, TIMESTAMP
from exchange.api.signing import hexdigest
from exchange.api.untimed import spend_untimed_signature

API_KEY_HEADER = "X-SERVICE-APIKEY"
SIGNATURE_HEADER = "X-SERVICE-SIGNATURE"
TIMESTAMP_HEADER = "X-SERVICE-TIMESTAMP"
_API_KEY_META = "HTTP_X_SERVICE_APIKEY"
_SIGNATURE_META = "HTTP_X_SERVICE_SIGNATURE"
_TIMESTAMP_META = "HTTP_X_SERVICE_TIMESTAMP"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_API_KEY_FORMAT = re.compile(r"[A-Za-z0-9]{1,64}")
FUTURE_TOLERANCE_MS = 1000


class Security(StrEnum):
    NONE = "NONE"
    TRADE = "TRADE"
    USER_DATA = "USER_DATA"
    USER_STREAM = "USER_STREAM"
    MARKET_DATA = "MARKET_DATA"

    @property
    def signed(self) -> bool:
        return self in (Security.TRADE, Security.USER_DATA)

    @property
    def needs_key(self) -> bool:
        return self is not Security.NONE


def server_time_ms() -> int:
    return time.time_ns() // 1_000_000


def strip_signature(text: str) -> str:
    """Remove every `signature=...` pair from a raw parameter text."""
    if "signature" not in text:
        return text
    return "&".join(part for part in text.split("&") if unquote_plus(part.split("=", 1)[0]) != "signature")


def _naive_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in text.split("&"):
        if part:
            key, _, value = part.partition("=")
            pairs.append((key, value))
    return pairs


def _decoded_variants(text: str, parsed: list[tuple[str, str]]) -> list[str]:
    """Decoded forms of `text` that split into exactly the parameters the server parsed."""
    if "%" not in text and "+" not in text:
        return []
    variants = []
    for decode in (unquote, unquote_plus):
        decoded = decode(text)
        if decoded != text and decoded not in variants and _naive_pairs(decoded) == parsed:
            variants.append(decoded)
    return variants


def _whole_pair(segment: str) -> bool:
    key, sep, _ = segment.partition("=")
    return bool(sep) and bool(key)


# Accepted by every signed endpoint besides its own parameters.
SIGNING_PARAMS = frozenset({"timestamp", "recvWindow", "signature"})


def _hides_a_pair(segment: str) -> bool:
    """Whether a `key=value` segment could be the text of two pairs joined with no `&`: its value
    holds a raw `=` (`message=hiamount=5`). A captured query `...&message=hi` with body `amount=5`
    resent as one part reads that way, and the amount is gone. Honest clients percent-encode `=`
    inside values (`%3D`)."""
    return "=" in segment.partition("=")[2]


def _hides_a_named_pair(segment: str, names: frozenset[str]) -> bool:
    """Whether a decoded `key=value` segment's value holds `=` right after one of the endpoint's
    parameter names (`message=hiclient_transfer_id=abc`): the decoded text of two pairs joined,
    the second one a parameter that an honest request could have carried at a query/body boundary."""
    value = segment.partition("=")[2]
    at = value.find("=")
    while at != -1:
        if any(value[:at].endswith(name) for name in names):
            return True
        at = value.find("=", at + 1)
    return False


def boundary_is_unambiguous(
    query: str, body: str, names: frozenset[str] | None = None, json_body: bool = False, decoded: bool = False
) -> bool:
    """totalParams joins query and body with nothing between them, so the same signed text can be
    cut in other places: a captured query `...&target_address=peer%40x.com` plus body `message=hi`
    resent as query `...peer%40x.co` plus body `mmessage=hi` sends to another address, and both
    parts resent as one loses a parameter. Only texts that can be read one way are accepted:
    - each part meets the other at a whole `key=value` pair (or an `&`), which every honest client does;
    - with `names` (the endpoint's parameters): where they meet without an `&`, the body's first
      key is one of them, and no other cut of the joined text would give a body starting with one;
    - with `names`: no value holds a raw `=` (two pairs joined, see _hides_a_pair), wherever the
      boundary was when the client signed;
    - with `names`: no part read as form text begins with `{` or `[`: a JSON body's signed text
      resent as a form body or a query string would be read as the pairs inside its strings.
    Applied to every text a signature may be checked against, the percent-decoded forms included
    (signature_candidates; `decoded`): `message=hiclient_transfer_id%3Dabc` decodes to two pairs
    joined. In a decoded text a value may hold `=` (a client signs `a=1=2` for a = "1=2"), but not
    right after a parameter name of the endpoint (_hides_a_named_pair).
    What cannot be told apart is a request the server would refuse as sent: a client whose body
    begins with a key the endpoint does not declare (`xamount=5`) is refused, but a cut of its text
    could read `amount=5`. Such a request never reaches an endpoint of ours as intended: clients
    begin the body with an endpoint parameter, or send everything in one part (docs/security.md)."""
    if names is not None:
        form_parts = (query,) if json_body else (query, body)  # a parsed JSON body is structured
        if any(part.startswith(("{", "[")) for part in form_parts):
            return False
        if any(
            _hides_a_named_pair(segment, names) if decoded else _hides_a_pair(segment)
            for part in form_parts
            if part
            for segment in part.split("&")
        ):
            return False
    if not query or not body:
        return True
    last = query.rsplit("&", 1)[-1]
    first = body.split("&", 1)[0]
    if not ((last == "" or _whole_pair(last)) and (first == "" or _whole_pair(first))):
        return False
    if names is None or last == "" or first == "":
        return True
    # The joined pair is `k1=` + middle + `=v2`, middle = v1 + k2. Every cut of `middle` gives a body
    # key; exactly one of them (the one received) may be a parameter of the endpoint.
    middle = last.partition("=")[2] + first.partition("=")[0]
    cuts = sum(1 for at in range(len(middle)) if unquote_plus(middle[at:]) in names)
    return unquote_plus(first.partition("=")[0]) in names and cuts == 1


def signature_candidates(
    query: str,
    body: str,
    query_pairs,
    body_pairs,
    header_timestamp: str = "",
    names: frozenset[str] | None = None,
    json_body: bool = False,
) -> list[str]:
    """totalParams as sent, then the decoded forms the official clients sign; none that could be
    read as other parameters (boundary_is_unambiguous, with the endpoint's parameter `names`; a
    JSON body is `json_body`). A timestamp sent only in the X-SERVICE-TIMESTAMP header must be signed
    too, as if it ended the query string; otherwise a captured request could be replayed forever
    with a fresh header."""
    query, body = strip_signature(query), strip_signature(body)
    if not boundary_is_unambiguous(query, body, names, json_body):
        return []
    if header_timestamp:
        suffix = f"timestamp={header_timestamp}"
        query = f"{query}&{suffix}" if query and not query.endswith("&") else query + suffix
        query_pairs = [*query_pairs, ("timestamp", header_timestamp)]
    candidates = [query + body]
    parsed_query = [(k, v) for k, v in query_pairs if k != "signature"]
    parsed_body = [(k, v) for k, v in body_pairs if k != "signature"]
    query_forms = [query, *_decoded_variants(query, parsed_query)]
    body_forms = [body, *_decoded_variants(body, parsed_body)] if body_pairs is not None and not json_body else [body]
    for q in query_forms:
        for b in body_forms:
            text = q + b
            if text in candidates or (
                names is not None and not boundary_is_unambiguous(q, b, names, json_body, decoded=True)
            ):
                continue
            candidates.append(text)
    return candidates


def verify_signature(keyed: hmac.HMAC | None, provided: str | None, candidates: list[str]) -> None:
    """`keyed` None: the key's secret could not be decrypted (accounts.keyring): nothing verifies."""
    if keyed is None or not provided or not _HEX64.fullmatch(provided):
        raise InvalidSignature()
    provided = provided.lower()
    ok = False
    for text in candidates:  # no early exit: the time taken does not depend on which one matched
        ok |= hmac.compare_digest(hexdigest(keyed, text), provided)
    if not ok:
        raise InvalidSignature()


def check_timing(timestamp: int, recv_window: int, now_ms: int | None = None) -> None:
    now_ms = server_time_ms() if now_ms is None else now_ms
    if timestamp >= now_ms + FUTURE_TOLERANCE_MS:
        raise TimestampAhead(timestamp - now_ms, FUTURE_TOLERANCE_MS - 1)
    if now_ms - timestamp > recv_window:
        raise TimestampBehind(now_ms - timestamp, recv_window)


def replay_window_seconds(valid_until_ms: int) -> int:
    """How long a signed write's signature is remembered: until its timestamp leaves the window
    (plus a second for clocks of other processes)."""
    return max(1, math.ceil((valid_until_ms - server_time_ms()) / 1000) + 1)


def ip_allowed(ip: str, entries: list[str]) -> bool:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address
    for entry in entries:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


@dataclass(frozen=True)
class EndpointAuth:
    security: Security
    key_type: str | None  # the functional key type the endpoint needs, if any
    writes: bool  # a read-only key is refused (-1020)
    ip_whitelist_required: bool  # the key must be IP-restricted (-1023)
    # The endpoint's parameter names with SIGNING_PARAMS: how a signed text may be read (M2 of
    # docs/security.md). None: no rule on names (only whole pairs at the boundary).
    param_names: frozenset[str] | None = None
    # A signed request may come without a timestamp (only the collect call, whose spec lists none
    # and whose clients send none): the signature is still required and checked, there is no
    # timing to check, and a write's signature is spent as soon as it verifies, for ever, whatever
    # the request then ends in (exchange/api/untimed.py).
    timestamp_optional: bool = False


class KeyStore(Protocol):
    """Where the gateway finds API keys. The gateway depends on no app: the accounts app registers
    its key cache (accounts.keyring.keyrings) with `register_key_store` when it loads."""

    def cached(self, key: str) -> bool:
        """Whether `key` can be answered without the database (known, or known to be unknown)."""

    def lookup(self, key: str) -> tuple[Any, Any] | None:
        """(the key's keyring, with `account()`; the key's record), or None for an unknown key."""


_key_store: KeyStore | None = None


def register_key_store(store: KeyStore) -> None:
    global _key_store
    _key_store = store


def key_store() -> KeyStore:
    if _key_store is None:
        raise RuntimeError("No API key store registered (accounts/apps.py registers it when Django starts).")
    return _key_store


@dataclass(frozen=True)
class Caller:
    api_key: Any  # the key store's record of the key (accounts.keyring.KeyRecord)
    account: Any  # accounts.models.User
    # A signed write is accepted once: (api key, lower-case signature, seconds to remember it, its
    # timestamp). The replay check is made with the rate-limit charge (ratelimit.charge), after
    # every check here.
    signature: tuple[str, str, int, int] | None = None


@dataclass(frozen=True)
class RawRequest:
    meta: dict
    query: str
    body: str
    query_pairs: list
    body_pairs: list | None
    params: dict  # merged, blanks dropped
    ip: str
    body_is_json: bool = False  # the body was read as a JSON object (not form text)


def authenticate(endpoint: EndpointAuth, raw: RawRequest) -> Caller | None:
    """Return the caller (key record, account, and the signature of a signed write to be accepted
    once), or None for NONE endpoints; raise on refusal. Refusals here never spend a timed
    signature; an untimed one is spent once it verifies (exchange/api/untimed.py)."""
    if not endpoint.security.needs_key:
        return None
    key_text = raw.meta.get(_API_KEY_META, "").strip()
    if not key_text:
        raise Unauthorized()
    found = key_store().lookup(key_text) if _API_KEY_FORMAT.fullmatch(key_text) else None
    if found is None:
        raise ApiKeyNotExist()
    keyring, api_key = found

    signature = None
    if endpoint.security.signed:
        header_timestamp = "" if raw.params.get("timestamp") else raw.meta.get(_TIMESTAMP_META, "").strip()
        timestamp_text = raw.params.get("timestamp") or header_timestamp
        if timestamp_text:
            timestamp = TIMESTAMP.parse(timestamp_text)
        elif endpoint.timestamp_optional:
            timestamp = None
        else:
            timestamp = TIMESTAMP.parse_missing()
        # Optional on every endpoint (docs/api.md): the official clients send it empty or not at all.
        recv_text = raw.params.get("recvWindow")
        recv_window = RECV_WINDOW.parse(recv_text) if recv_text else RECV_WINDOW.default
        provided = raw.params.get("signature") or raw.meta.get(_SIGNATURE_META, "").strip()
        candidates = signature_candidates(
            raw.query,
            raw.body,
            raw.query_pairs,
            raw.body_pairs,
            header_timestamp,
            endpoint.param_names,
            raw.body_is_json,
        )
        verify_signature(api_key.signer, provided, candidates)
        if timestamp is not None:
            check_timing(timestamp, recv_window)
            if endpoint.writes:
                signature = (api_key.key, provided.lower(), replay_window_seconds(timestamp + recv_window), timestamp)
        elif endpoint.writes:
            # No window ends an untimed signature: it is spent now, before the checks below, so a
            # request they refuse cannot be replayed once their cause is lifted (issue 34, finding 8).
            spend_untimed_signature(api_key.key, provided.lower())

    account = keyring.account()
    if not api_key.is_enabled or not account.is_active:
        raise ApiKeyNotEnabled()
    if account.is_frozen:  # every key of a frozen account, for every endpoint (accounts/policy.py)
        raise AccountFrozen()
    if account.system_role is not None:  # the service's own ledger accounts have no API
        raise ApiKeyNotEnabled()
    if endpoint.writes and api_key.is_read_only:
        raise UnsupportedOperation()
    if endpoint.key_type and endpoint.key_type not in api_key.types:
        raise ApiKeyTypeWrong(endpoint.key_type)
    if api_key.ip_restrict:
        if not api_key.ip_list:
            raise BindIpWhiteListFirst()
        if not ip_allowed(raw.ip, api_key.ip_list):
            raise IpNotInWhitelist(raw.ip)
    elif endpoint.ip_whitelist_required:
        raise BindIpWhiteListFirst()
    return Caller(api_key, account, signature)
