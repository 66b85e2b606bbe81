"""Wallet refusals (deposits, withdrawals, transfers). Each subclasses the gateway error whose code
and HTTP status it answers (exchange/api/errors.py; the table in docs/api.md), so a client sees the
spec's codes and a reader or a test can name the refusal."""

from __future__ import annotations

from exchange.api.errors import BadRequest, InvalidParameter, ParameterInvalid, UserNotFound


class UnknownCoin(InvalidParameter):
    """A coin with no network here."""

    message = "Parameter 'coin' is not valid."


class UnknownNetwork(InvalidParameter):
    """A known coin on a network it is not offered on."""

    message = "Parameter 'network' is not valid."


class UnknownAsset(InvalidParameter):
    """A transfer's `account` (its asset) that is not an asset here."""

    message = "Parameter 'account' is not valid."


class InvalidAmount(ParameterInvalid):
    """An amount out of bounds, too precise or not a multiple: InvalidAmount(why)."""

    message = "Parameter 'amount' is not valid: %s."


class AddressNotWhitelisted(ParameterInvalid):
    """A withdrawal to an address that is not in the account's withdrawal whitelist."""

    message = (
        "Parameter 'address' is not valid: coin, network, address and addressTag are not in the withdrawal whitelist."
    )


class TransferToSelf(ParameterInvalid):
    """A transfer whose target_address is the sender's own."""

    message = "Parameter 'target_address' is not valid: a transfer cannot go to the sender."


class RecipientNotFound(UserNotFound):
    """A target_address of no account that may receive (unknown, frozen, deactivated or a system account)."""

    message = "No account has this target_address."


class DepositSuspended(BadRequest):
    """Deposits of the coin on the network are switched off: DepositSuspended(coin, network)."""

    message = "Depositing %s on %s is suspended."


class WithdrawalSuspended(BadRequest):
    """Withdrawals of the coin on the network are switched off: WithdrawalSuspended(coin, network)."""

    message = "Withdrawing %s on %s is suspended."


class LimitExceeded(BadRequest):
    """An outflow over the account's limit: LimitExceeded(period, which), as accounts.limits.outflow_refusal says."""

    message = "The %s %s limit would be exceeded."


class DuplicateWithdrawOrderId(BadRequest):
    """A withdrawOrderId the account has used before."""

    message = "Duplicate withdrawOrderId: it was already used on this account."


class DuplicateClientTransferId(BadRequest):
    """A client_transfer_id the sender has used before (docs/api.md, "Transfers"): the same answer
    whoever the target address belongs to, naming the sender's own transfer that used it."""

    message = "Duplicate client_transfer_id: it was already used on this account."

    @classmethod
    def of(cls, transfer_id: int, *, same_request: bool) -> DuplicateClientTransferId:
        if same_request:
            why = f"this transfer was already made (id {transfer_id}); nothing moved again."
        else:
            why = f"it was already used on this account by transfer {transfer_id}."
        return cls(msg=f"Duplicate client_transfer_id: {why}")
