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
