"""API secrets are stored encrypted (Fernet: AES-128-CBC + HMAC-SHA256).

Keys come from API_SECRET_ENCRYPTION_KEYS (comma separated, newest first, so keys can be rotated:
new secrets use the first, old ones still decrypt). In development a key is derived from SECRET_KEY.
"""

from __future__ import annotations

import base64
from functools import lru_cache

from cryptography.fernet import Fernet, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    if keys:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"exchange api secret encryption").derive(
        secret_key.encode()
    )
    return MultiFernet([Fernet(base64.urlsafe_b64encode(derived))])


def _current() -> MultiFernet:
    return _fernet(tuple(settings.API_SECRET_ENCRYPTION_KEYS), settings.SECRET_KEY)


def encrypt_secret(plaintext: str) -> str:
    return _current().encrypt(plaintext.encode()).decode()


def decrypt_secret(ciphertext: str) -> str:
    return _current().decrypt(ciphertext.encode()).decode()
