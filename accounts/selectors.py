from __future__ import annotations

from accounts.keyring import keyrings
from accounts.models import User


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


def user_get_by_address(*, address: str) -> User | None:
    """A user by e-mail (case-insensitive) or phone number."""
    address = address.strip()
    if "@" in address:
        return User.objects.filter(email=address.lower()).first()
    return User.objects.filter(phone=address).first()
