"""How staff change the wallet's settings that matter to money (exchange/backoffice/changes.py; the rule of
each field: accounts/controls.py explains the directions).

- Network: the withdrawal fee, minimum and integer multiple lowered loosen; the maximum raised
  loosens; withdrawals switched on loosen (off applies at once: a stop is never delayed);
  deposits' confirmations lowered loosen (a deposit is credited before it is final); the address
  and memo formats: any change waits (they decide which addresses are accepted).
- TransferFee.fee lowered loosens.
- WhitelistAddress (issue 34): every entry added or changed needs a reason and is audited, and
  applies at once (an entry lets only the customer's own signed request send there; staff cannot
  send); removing one is wallet.withdrawals.whitelist_entry_remove, audited too.
"""

from __future__ import annotations

from exchange.backoffice.changes import ANY, AUDITED, HIGHER, LOWER, ON, guard
from wallet.models import Network, TransferFee, WhitelistAddress


def register() -> None:
    guard(
        Network,
        action="network",
        fields={
            "name": AUDITED,
            "withdraw_desc": AUDITED,
            "deposit_enable": AUDITED,
            "withdraw_enable": ON,
            "withdraw_fee": LOWER,
            "withdraw_min": LOWER,
            "withdraw_integer_multiple": LOWER,
            "withdraw_max": HIGHER,
            "min_confirm": LOWER,
            "unlock_confirm": LOWER,
            "address_regex": ANY,
            "memo_regex": ANY,
            "same_address": ANY,
        },
    )
    guard(TransferFee, action="transfer_fee", fields={"asset": ANY, "fee": LOWER})
    guard(
        WhitelistAddress,
        action="whitelist",
        fields={"account": AUDITED, "network": AUDITED, "address": AUDITED, "tag": AUDITED, "name": AUDITED},
    )
