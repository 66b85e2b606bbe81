from __future__ import annotations

from accounts.models import ApiKey, User


def api_key_get_for_auth(*, key: str) -> ApiKey | None:
    """The key and its user in one query, for the gateway."""
    return ApiKey.objects.select_related("user").filter(key=key).first()


def api_key_list(*, user: User) -> list[dict]:
    """The caller's keys as GET /openapi/v1/api-keys shows them."""
    return [
        {
            "apiKey": key.key,
            "apiName": key.name,
            "apiType": list(key.types),
            "status": key.status,
            "createTime": str(int(key.created_at.timestamp() * 1000)),
            "ipAccessRestrictions": list(key.ip_list) if key.ip_restrict else [],
        }
        for key in ApiKey.objects.filter(user=user).order_by("id")
    ]


def user_get_by_address(*, address: str) -> User | None:
    """A user by e-mail (case-insensitive) or phone number."""
    address = address.strip()
    if "@" in address:
        return User.objects.filter(email=address.lower()).first()
    return User.objects.filter(phone=address).first()
