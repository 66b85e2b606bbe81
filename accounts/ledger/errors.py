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
