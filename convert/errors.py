"""Convert refusals. Each is a ConvertError: the exception handler answers it in the convert
envelope, `{"status": 10000003, "error": <message>, "data": null}` (exchange/api/envelope.py), with
the spec's messages ("Convert status codes")."""

from exchange.api.errors import ConvertError


class QuoteExpired(ConvertError):
    """Accepting a quote after its expiry."""

    message = "quote expired"


class ConvertInsufficientBalance(ConvertError):
    """A conversion whose source amount the account's free balance does not cover."""

    message = "insufficient balance"


class LiquidityUnavailable(ConvertError):
    """No price or liquidity for the pair right now."""

    message = "failed to fetch liquidity, try again later"


class PriceChanged(ConvertError):
    """The rate moved since the quote; the client must confirm the updated one."""

    message = "price has changed and the updated rate must be confirmed"


class AccountUnavailable(ConvertError):
    """The account may not convert (frozen, deactivated, barred from moving money out)."""

    message = "unable to fetch account information"


class ConvertSuspended(ConvertError):
    """Operators turned the CONVERT business status off."""

    message = "convert is suspended; try again later"


class PairNotSupported(ConvertError):
    """No enabled pair from sourceCurrency to targetCurrency."""

    message = "the pair %s to %s is not supported"


class AmountRefused(ConvertError):
    """An amount outside the pair's bounds or precision: AmountRefused(why)."""

    message = "%s"


class OneAmountRequired(ConvertError):
    """Both or neither of sourceAmount and targetAmount."""

    message = "send exactly one of sourceAmount and targetAmount"


class QuoteTooSoon(ConvertError):
    """A second quote request for the same pair within CONVERT_QUOTE_INTERVAL_MS."""

    message = "quote requests are limited to one per %s ms per pair; try again later"


class QuoteNotFound(ConvertError):
    """No quote with this id for the caller (another account's quote is not revealed)."""

    message = "quote does not exist"


class QuoteAlreadyUsed(ConvertError):
    """A quote is accepted once; its order already exists."""

    message = "quote was already accepted"
