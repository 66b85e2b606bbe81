from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class UserManager(BaseUserManager):
    use_in_migrations = True

    def create_user(self, email: str, password: str | None = None, **fields) -> User:
        user = self.model(email=self.normalize_email(email).lower(), **fields)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email: str, password: str | None = None, **fields) -> User:
        fields.update(is_staff=True, is_superuser=True)
        return self.create_user(email, password, **fields)


class User(AbstractBaseUser, PermissionsMixin):
    """A customer account (identified by e-mail, and by phone number where it has one) or a staff
    member. A sub-account points at its master; a master has no master."""

    email = models.EmailField(unique=True)
    phone = models.CharField(
        max_length=32,
        unique=True,
        null=True,
        blank=True,
        help_text="E.164, e.g. +639171234567; used as a transfer address.",
    )
    master = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="sub_accounts",
        help_text="Set for a sub-account: its master account.",
    )
    is_virtual = models.BooleanField(default=False, help_text="A virtual sub-account created through the API.")
    is_frozen = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False, help_text="May log in to the admin.")
    date_joined = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(master=F("id")), name="user_not_own_master"),
        ]

    def __str__(self) -> str:
        return self.email

    @property
    def is_sub_account(self) -> bool:
        return self.master_id is not None


class ApiKeyType(models.TextChoices):
    READ_ONLY = "Read only"
    SPOT = "Enable Spot"
    CONVERT = "Enable Convert"
    CRYPTO_WALLET = "Enable Crypto Wallet"
    FIAT = "Enable Fiat"
    ACCOUNT = "Enable Account"


FUNCTIONAL_KEY_TYPES = (
    ApiKeyType.SPOT,
    ApiKeyType.CONVERT,
    ApiKeyType.CRYPTO_WALLET,
    ApiKeyType.FIAT,
    ApiKeyType.ACCOUNT,
)


class ApiKeyStatus(models.TextChoices):
    ENABLE = "ENABLE"
    NOT_ENABLE = "NOT_ENABLE"


class ApiKey(models.Model):
    """An API key. The secret is stored encrypted (accounts/crypto.py) and shown once, at creation."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=64)
    key = models.CharField(max_length=64, unique=True)
    secret_ciphertext = models.TextField(editable=False)
    types = models.JSONField(default=list, help_text="Key types; 'Read only' forbids every write.")
    status = models.CharField(max_length=16, choices=ApiKeyStatus.choices, default=ApiKeyStatus.ENABLE)
    ip_restrict = models.BooleanField(default=False, help_text="Only requests from the IP list are accepted.")
    ip_list = models.JSONField(default=list, blank=True, help_text="Addresses or CIDR networks.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.key[:8]}…)"
