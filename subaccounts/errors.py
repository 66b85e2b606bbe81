"""Sub-account refusals. Each subclasses the gateway error whose code and HTTP status it answers
(exchange/api/errors.py; docs/subaccounts.md lists them)."""

from exchange.api.errors import BadRequest, NoPermission, ParameterInvalid, UserNotFound


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
    """An accountName (e-mail) some account already has."""

    message = "An account with this e-mail already exists."


class TooManySubAccounts(BadRequest):
    """A master's 31st virtual sub-account: TooManySubAccounts(limit)."""

    message = "A master account can have at most %s virtual sub-accounts."


class UnknownAsset(ParameterInvalid):
    """An asset code that is not an asset here: UnknownAsset(parameter name)."""

    message = "Parameter '%s' is not valid: no such asset."


class InvalidAmount(ParameterInvalid):
    """An amount that is not positive or too precise: InvalidAmount(why)."""

    message = "Parameter 'amount' is not valid: %s."


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
