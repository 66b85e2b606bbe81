"""Who may move money: the one place every flow asks before funds leave or enter an account.

Transfers, withdrawals and, as they arrive, conversions and sub-account transfers call these
functions; none of them reads `is_frozen`, `is_active` or `can_withdraw` itself. The gateway also
refuses every API key of a frozen or deactivated account (-2015, exchange/api/auth.py), so these
checks are the second line: they hold for calls that do not come through a customer's key
(operators, scheduled jobs, a master acting on its sub-account).

- A frozen or deactivated account sends nothing (-1152), nor does one whose `can_withdraw` is off
  (operators' withdrawal bar covers every way out: withdrawals, transfers, and later conversions
  and sub-account transfers out), nor any of the service's own system accounts.
- A frozen or deactivated account receives no transfer. The sender is told only that no account
  has the address (-1151): telling a third party that an account is frozen would tip them off.
- Funds move only with a key of the matching functional type: Enable Fiat for fiat assets,
  Enable Crypto Wallet for crypto. Enable Spot (order-book trading) and Enable Convert do not move
  funds to another account, so they do not qualify.
- An asset without a reference price (0, the default of a new asset) cannot be moved: every limit
  and the withdrawal approval threshold value movements at that price, so at 0 none would apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accounts.errors import AssetNotPriced
from accounts.ledger.errors import AccountMayNotSend
from accounts.models import ApiKeyType
from accounts.selectors import asset_by_code

if TYPE_CHECKING:
    from exchange.api.views import GatewayApi

# The currency limits and withdrawal approvals are valued in when an account has no limit tier.
DEFAULT_VALUATION_CURRENCY = "PHP"


def may_send(account) -> bool:
    """The service's own accounts (world, fees, convert liquidity, equity) move money only through
    the services that own those movements (deposits, fees, adjustments), never as a sender."""
    return account.is_active and not account.is_frozen and account.can_withdraw and account.system_role is None


def may_receive(account) -> bool:
    """`account` is a User or anything with `is_active` and `is_frozen` (accounts.selectors.UserRef)."""
    return account.is_active and not account.is_frozen


def require_may_send(account) -> None:
    if not may_send(account):
        raise AccountMayNotSend()


def fund_key_type(asset) -> str:
    """The functional key type that moves `asset` out of an account."""
    return ApiKeyType.FIAT if asset.is_fiat else ApiKeyType.CRYPTO_WALLET


def require_fund_key(api: GatewayApi, asset_code: str) -> None:
    """An endpoint that moves `asset_code` out of the caller's account refuses a key without the
    asset's fund-moving type (-2019), before its service runs. An unknown asset passes here: the
    service refuses it (-1025)."""
    asset = asset_by_code(asset_code)
    if asset is not None:
        api.require_key_type(fund_key_type(asset))


def require_priced(asset, *, valuation_currency: str | None) -> None:
    """Refuse to move an asset that is not priced in the currency its movements are valued in."""
    currency = valuation_currency or DEFAULT_VALUATION_CURRENCY
    if asset.code != currency and not asset.reference_price > 0:
        raise AssetNotPriced(asset.code)
