"""The signed client: requests signed the way the official connector signs them."""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import unquote, urlencode

from django.test import Client

FORM = "application/x-www-form-urlencoded"


def now_ms() -> int:
    return int(time.time() * 1000)


def hmac_hex(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


class SignedClient:
    """Sends requests the way the official connector does: parameters urlencoded in the query
    string (or form body), `timestamp` added, `signature` = HMAC-SHA256 over totalParams."""

    def __init__(self, api_key: str, secret: str, ip: str = "127.0.0.1"):
        self.client = Client()
        self.api_key = api_key
        self.secret = secret
        self.ip = ip

    @classmethod
    def of(cls, created: tuple, ip: str = "127.0.0.1") -> SignedClient:
        """The client of an `(ApiKey, secret)` pair, as `ApiKeyFactory` and `make_key` return it."""
        api_key, secret = created
        return cls(api_key.key, secret, ip)

    def request(
        self,
        method: str,
        path: str,
        params: dict | None = None,
        *,
        body: dict | str | None = None,
        signed: bool = True,
        timestamp: int | None = None,
        signature: str | None = None,
        headers: dict | None = None,
        ip: str | None = None,
        api_key: str | None = None,
    ):
        params = dict(params or {})
        if signed and timestamp is not False:
            params.setdefault("timestamp", timestamp if timestamp is not None else now_ms())
        query = urlencode(params) if params else ""
        body_text = urlencode(body) if isinstance(body, dict) else (body or "")
        if signed and signature is None:
            signature = hmac_hex(self.secret, query + body_text)
        if signed and signature:
            query = f"{query}&signature={signature}" if query else f"signature={signature}"
        all_headers = {"X-SERVICE-APIKEY": self.api_key if api_key is None else api_key, **(headers or {})}
        if all_headers["X-SERVICE-APIKEY"] is None:
            del all_headers["X-SERVICE-APIKEY"]
        return self.client.generic(
            method,
            f"{path}?{query}" if query else path,
            data=body_text,
            content_type=FORM,
            headers=all_headers,
            REMOTE_ADDR=ip or self.ip,
        )

    def get(self, path, params=None, **kw):
        return self.request("GET", path, params, **kw)

    def post(self, path, params=None, **kw):
        return self.request("POST", path, params, **kw)

    def put(self, path, params=None, **kw):
        return self.request("PUT", path, params, **kw)

    def delete(self, path, params=None, **kw):
        return self.request("DELETE", path, params, **kw)


def connector_call(client: SignedClient, method: str, path: str, params: dict | None = None):
    """A request the way the official Python connector sends it: parameters left out when empty,
    all of them (POST's too) urlencoded in the query string, `timestamp` added, and the signature
    computed over the percent-decoded text (an e-mail's `@` signed as `@`, sent as `%40`)."""
    sent = {name: value for name, value in (params or {}).items() if value not in ("", None)}
    sent["timestamp"] = now_ms()
    query = urlencode(sent)
    return client.request(method, path, sent, signature=hmac_hex(client.secret, unquote(query)))


def postman_call(client: SignedClient, method: str, path: str, params: dict, *, timestamp: bool = True):
    """A request the way the official Postman collection sends it: every parameter of the request
    present, the ones not filled in sent empty (`recvWindow=&`), the text not percent-encoded, and
    the signature over that text as sent. `timestamp=False`: a request of the collection that has
    neither `recvWindow` nor `timestamp` (subAccount/collect-from-subaccount sends only its own
    parameters and the signature)."""
    sent = {name: "" if value is None else value for name, value in params.items()}
    if timestamp:
        sent = {"recvWindow": "", **sent, "timestamp": now_ms()}
    query = "&".join(f"{name}={value}" for name, value in sent.items())
    query += f"&signature={hmac_hex(client.secret, query)}"
    return client.client.generic(
        method,
        f"{path}?{query}",
        content_type=FORM,
        headers={"X-SERVICE-APIKEY": client.api_key},
        REMOTE_ADDR=client.ip,
    )
