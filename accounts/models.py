from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Lower
from django.utils import timezone

from accounts.phones import phone_normalised
from exchange.runtime.ttlcache import ReferenceQuerySet


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


class SystemRole(models.TextChoices):
    WORLD = "world", "Outside world (chain and fiat rails)"
    FEES = "fees", "Fees collected"
    CONVERT_LIQUIDITY = "convert_liquidity", "Conversion liquidity"
    EQUITY = "equity", "Operator adjustments and funding"


def family_email(email: str, requested_email: str) -> str:
    """How an account is named to its family (the sub-account endpoints, and `em` on the master's
    stream): a virtual sub-account by the e-mail its master named it with (`requested_email`,
    issue 34), any other by its own e-mail. Outside the family (P2P, logins) only `email` counts."""
    return requested_email or email


class User(AbstractBaseUser, PermissionsMixin):
    """A customer account (identified by e-mail, and by phone number where it has one) or a staff
    member. A sub-account points at its master; a master has no master."""

    email = models.EmailField(unique=True)
    phone = models.CharField(
        max_length=32,
        unique=True,
        null=True,
        blank=True,
        help_text="E.164, e.g. +639171234567; used as a transfer address. Unique compared normalised "
        "(spaces, dashes and brackets ignored: accounts/phones.py).",
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
    # A virtual sub-account's `email` is its address in the reserved space (subaccounts/addresses.py:
    # never a customer's e-mail, so it squats nobody and blocks no registration). The e-mail its
    # master named it with is kept here, as sent, and is what the family's endpoints answer and take
    # (issue 34); it is unique per master and never looked up outside the family (no login, no P2P).
    requested_email = models.EmailField(
        blank=True,
        default="",
        help_text="A virtual sub-account: the e-mail its master named it with (accountName). Shown and "
        "looked up only inside its family; never a login or a transfer address.",
    )
    is_frozen = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False, help_text="May log in to the admin.")
    date_joined = models.DateTimeField(default=timezone.now)
    system_role = models.CharField(
        max_length=32,
        choices=SystemRole.choices,
        null=True,
        blank=True,
        help_text="Set only for the service's own ledger accounts.",
    )
    system_shard = models.PositiveSmallIntegerField(
        default=0,
        help_text="A house role may be split over several accounts (shards) so that postings of different "
        "customers do not queue on one lock (accounts/ledger/system.py).",
    )
    # Permissions operators set; reported by GET /openapi/v1/account.
    can_trade = models.BooleanField(default=True)
    can_deposit = models.BooleanField(default=True)
    can_withdraw = models.BooleanField(default=True)
    enable_withdraw_whitelist = models.BooleanField(default=False)
    is_whitelisted_master = models.BooleanField(
        default=False, help_text="A master whose user data stream also carries its sub-accounts' events."
    )
    base_token = models.CharField(max_length=16, default="PHP", help_text="The account's base token.")
    limit_tier = models.ForeignKey(
        "accounts.LimitTier",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="accounts",
        help_text="Daily/monthly/annual limits; none = the default tier.",
    )

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(master=F("id")), name="user_not_own_master"),
            models.UniqueConstraint(
                Lower("requested_email"),
                F("master"),
                condition=~Q(requested_email=""),
                name="requested_email_once_per_master",
            ),
            models.UniqueConstraint(
                fields=["system_role", "system_shard"],
                condition=Q(system_role__isnull=False),
                name="one_account_per_system_role_shard",
            ),
            # One account per number, compared as transfers find it (accounts/phones.py).
            models.UniqueConstraint(phone_normalised(), name="user_phone_normalised_unique"),
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


class LimitPeriod(models.TextChoices):
    DAILY = "daily"
    MONTHLY = "monthly"
    ANNUALLY = "annually"
    P2P_DAILY = "p2pDaily"
    P2P_MONTHLY = "p2pMonthly"
    P2P_ANNUALLY = "p2pAnnually"


class LimitTier(models.Model):
    """A set of limits operators assign to accounts. Amounts are in `currency`; each asset's
    movements are valued at its reference price (Asset.reference_price)."""

    name = models.CharField(max_length=64, unique=True)
    currency = models.CharField(max_length=16, default="PHP")
    is_default = models.BooleanField(default=False, help_text="Used for accounts without a tier.")

    objects = ReferenceQuerySet.as_manager()  # cached per process with its limits (accounts/limits.py)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=models.Q(is_default=True), name="one_default_tier")
        ]

    def __str__(self) -> str:
        return self.name


class TierLimit(models.Model):
    tier = models.ForeignKey(LimitTier, on_delete=models.CASCADE, related_name="limits")
    period = models.CharField(max_length=16, choices=LimitPeriod.choices)
    cash_in_limit = models.DecimalField(max_digits=36, decimal_places=18)
    cash_out_limit = models.DecimalField(max_digits=36, decimal_places=18)
    total_withdraw_limit = models.DecimalField(max_digits=36, decimal_places=18)

    objects = ReferenceQuerySet.as_manager()  # cached per process with its tier (accounts/limits.py)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tier", "period"], name="one_limit_per_tier_period")]

    def __str__(self) -> str:
        return f"{self.tier} {self.period}"


class RevocationSequence(models.Model):
    """The embedded mode's revocation counter (one row, id 1): how many entries the revocation log
    has ever had. Taken with its row lock in the transaction of the change it counts, so entries
    commit in their order (accounts/keyring.py, docs/security.md "Embedded revocation")."""

    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"revocation {self.value}"


class RevocationLog(models.Model):
    """One entry of the embedded mode's revocation log: an account whose keys or state changed, or
    one of whose listenKeys was closed. Without Redis, every process reads the entries after the
    last one it saw every API_KEY_REVOCATION_SECONDS / 4 and evicts what they name; the newest
    LOG_LENGTH (accounts/keyring.py) are kept."""

    seq = models.BigIntegerField(primary_key=True)
    account_id = models.BigIntegerField()
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.seq}: account {self.account_id}"


from accounts.ledger.models import (  # noqa: E402 - the ledger's tables belong to this app
    Asset,
    Balance,
    BalanceChange,
    Entry,
    LedgerAccount,
    LedgerCheckRun,
    LimitCounter,
    Posting,
)

__all__ = [
    "ApiKey",
    "ApiKeyStatus",
    "ApiKeyType",
    "Asset",
    "Balance",
    "BalanceChange",
    "Entry",
    "LedgerAccount",
    "LedgerCheckRun",
    "LimitCounter",
    "LimitPeriod",
    "LimitTier",
    "Posting",
    "RevocationLog",
    "RevocationSequence",
    "SystemRole",
    "TierLimit",
    "User",
]
