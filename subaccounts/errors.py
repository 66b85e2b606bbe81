"""Sub-account refusals. Each subclasses the gateway error whose code and HTTP status it answers
(exchange/api/errors.py; docs/subaccounts.md lists them)."""

from exchange.api.errors import BadRequest, NoPermission, ParameterInvalid, RequestRepeated, UserNotFound


class MasterOnly(NoPermission):
    """A master's endpoint called with a sub-account's key (-1152)."""

    message = "Not authorized to operate this API: it is for a master account; this key is a sub-account's."


class SubAccountOnly(NoPermission):
    """A sub-account's endpoint called with a master's (or any non-sub-account's) key (-1152)."""

    message = "Not authorized to operate this API: it is for a sub-account; call it with the sub-account's key."


class SubAccountNotFound(UserNotFound):
    """An e-mail that is not a sub-account of the caller (unknown, another master's, not a sub-account)."""

    message = "No sub-account of this account has the e-mail %s."


class InvalidAccountName(ParameterInvalid):
    """An accountName that is not an e-mail address: InvalidAccountName(why)."""

    message = "Parameter 'accountName' is not valid: %s."


class AccountNameTaken(BadRequest):
    """An accountName one of the master's own sub-accounts already has (names are scoped per
    master: subaccounts/addresses.py)."""

    message = "A sub-account with this name already exists."


class TooManySubAccounts(BadRequest):
    """A master's 31st virtual sub-account: TooManySubAccounts(limit)."""

    message = "A master account can have at most %s virtual sub-accounts."


class NoSuchAsset(ParameterInvalid):
    """An asset code that is not an asset here: NoSuchAsset(parameter name)."""

    message = "Parameter '%s' is not valid: no such asset."


class EmailRequired(ParameterInvalid):
    """A universal transfer without fromEmail and toEmail."""

    message = "Parameter 'fromEmail' is not valid: send fromEmail, toEmail or both."


class SameAccount(ParameterInvalid):
    """A universal transfer whose source and target are the same account."""

    message = "Parameter 'toEmail' is not valid: the source and the target are the same account."


class DuplicateClientTranId(BadRequest):
    """A clientTranId the master (of this family) has used before."""

    message = "Duplicate clientTranId: it was already used in this account's family."


class TargetMayNotReceive(NoPermission):
    """A universal transfer into a frozen or deactivated account of the family (-1152)."""

    message = "The target account is frozen or deactivated: it cannot receive."


# --- API-key IP restrictions (issue 15, item 7) ---------------------------------------------------


class SubAccountKeyNotFound(UserNotFound):
    """An apikey that is not a key of the named sub-account: unknown, the master's own, a sibling's,
    anyone else's (-1151, the same answer in every case: it tells the caller nothing about keys
    outside the sub-account)."""

    message = "Sub-account %s has no API key with this value."


class InvalidIpAddress(ParameterInvalid):
    """An ipAddress batch with a bad entry, too many addresses, or nothing to act on:
    InvalidIpAddress(why). Nothing is changed."""

    message = "Parameter 'ipAddress' is not valid: %s."


# --- fund collection -------------------------------------------------------------------------------


class CollectRequestRepeated(RequestRepeated):
    """A collect while another collection task of the same master is still INIT (spec: -10324)."""


class DuplicateClientRequestId(BadRequest):
    """A clientRequestId the master has used for a collection before (-1010, like clientTranId)."""

    message = "Duplicate clientRequestId: it was already used by this account."
