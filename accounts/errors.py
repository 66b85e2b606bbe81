"""Accounts refusals: who may move money (accounts/policy.py) and the account endpoints. Each
subclasses the gateway error whose code and HTTP status it answers (exchange/api/errors.py). A
sender that may not send is refused by the ledger too, so that refusal is the ledger's own
(accounts/ledger/errors.py, AccountMayNotSend)."""

from exchange.api.errors import BadRequest, InvalidParameter, NoPermission


class AssetNotPriced(BadRequest):
    """An asset without a reference price in the currency its movements are valued in: AssetNotPriced(code)."""

    message = "Moving %s is suspended until operations set its reference price."


class NotASubAccount(NoPermission):
    """A subUserId that is not a sub-account of the caller."""

    message = "subUserId is not a sub-account of this account."


class HistorySpanTooLong(InvalidParameter):
    """A transaction history query whose startTime and endTime are more than 7 days apart."""

    message = "The span between startTime and endTime must not exceed 7 days."
