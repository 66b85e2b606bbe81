"""The signing primitive: hex HMAC-SHA256 of a text keyed with an API secret.

The lowest module of the gateway: it imports nothing of the project, so both the authentication
(exchange/api/auth.py, which verifies) and the key cache (accounts/keyring.py, which keeps one keyed
HMAC per key) can use it without importing each other.
"""

from __future__ import annotations

import hashlib
import hmac


def signer(secret: str) -> hmac.HMAC:
    """HMAC-SHA256 keyed with `secret`, to be copied per message (the keyring keeps one per key)."""
    return hmac.new(secret.encode(), digestmod=hashlib.sha256)


def hexdigest(keyed: hmac.HMAC, text: str) -> str:
    """The hex signature of `text` with a keyed HMAC from `signer`, which is left untouched."""
    mac = keyed.copy()
    mac.update(text.encode())
    return mac.hexdigest()


def sign(secret: str, text: str) -> str:
    """The signature a client sends for `text` (tests and tools sign with it)."""
    return hexdigest(signer(secret), text)
