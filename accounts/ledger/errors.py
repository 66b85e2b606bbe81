"""The ledger's own refusals. The ledger knows no wire format: the gateway answers each of these
with a row of its code table (registered in accounts/apps.py with exchange.api.errors.answer_as),
and an app that expects one catches it by this name."""


class LedgerError(Exception):
    """Base of the ledger's refusals: nothing was written."""


class InsufficientBalance(LedgerError):
    """A debit the balance does not cover, refused under the ledger's lock (answered -1131,
    "Balance insufficient.", HTTP 400)."""

    def __init__(self, msg: str = "Balance insufficient.") -> None:
        super().__init__(msg)


class AccountMayNotSend(LedgerError):
    """A sender frozen, deactivated, barred from withdrawing, or one of the service's own accounts:
    refused by the ledger under its lock and by accounts/policy.py before (answered -1152 with this
    message, HTTP 401)."""

    def __init__(
        self, msg: str = "This account may not send funds: it is frozen, deactivated or barred from withdrawing."
    ) -> None:
        super().__init__(msg)
