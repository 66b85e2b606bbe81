"""The back office's world for its tests: a customer with USDT on TRX and a whitelisted address,
a withdrawal waiting for approval, a deposit held for travel-rule data (NEED_FILL_DATA), and a ban.
Everything is made through the services, as the customer's own requests would make it."""

from __future__ import annotations

import re
from decimal import Decimal
from itertools import count

from django.test import override_settings
from django.urls import reverse

from accounts.models import User
from exchange.api import ratelimit
from exchange.api.models import RateLimitBan
from tests.support.factories import NetworkFactory, WhitelistAddressFactory, customer
from wallet import deposits as wallet_deposits
from wallet import withdrawals as wallet_withdrawals
from wallet.models import Deposit, DepositStatus, Withdrawal, WithdrawalStage

_tx_ids = count(1)


def usdt_customer(funding: str = "1000", **user):
    """A customer holding `funding` USDT, with a whitelisted TRX address (tests.support.factories.Customer)."""
    made = customer(funding={"USDT": funding} if Decimal(funding) else {}, **user)
    WhitelistAddressFactory(account=made.user, network=NetworkFactory(coin__code="USDT", network="TRX"))
    return made


def trx_withdrawal(user: User, amount: str = "10", **fields) -> Withdrawal:
    """A USDT withdrawal over TRX to the user's whitelisted TRX address, through the wallet's service."""
    return whitelisted_withdrawal(user, "USDT", "TRX", amount, **fields)


def whitelisted_withdrawal(user: User, coin: str, network: str, amount: str, **fields) -> Withdrawal:
    """A withdrawal of `coin` over `network` to the user's whitelisted address there, through the
    wallet's service."""
    entry = user.withdraw_whitelist.get(network__network=network)
    return wallet_withdrawals.withdrawal_apply(
        account=user,
        coin=coin,
        network=network,
        address=entry.address,
        tag="",
        amount=Decimal(amount),
        withdraw_order_id=None,
        **fields,
    )


def awaiting_withdrawal(user: User, amount: str = "10") -> Withdrawal:
    """A USDT withdrawal waiting for an operator (the approval threshold lowered to 1 PHP)."""
    with override_settings(WITHDRAWAL_APPROVAL_THRESHOLD=Decimal(1)):
        withdrawal = trx_withdrawal(user, amount)
    assert withdrawal.stage == WithdrawalStage.AWAITING_APPROVAL
    return withdrawal


def held_deposit(user: User, amount: str = "20") -> Deposit:
    """A confirmed USDT deposit held for travel-rule data (threshold lowered to 1 PHP)."""
    with override_settings(TRAVEL_RULE_THRESHOLD=Decimal(1)):
        address = wallet_deposits.deposit_address_get(account=user, coin="USDT", network="TRX")
        deposit = wallet_deposits.deposit_record(
            network=address.network,
            tx_id=f"{next(_tx_ids) + Deposit.objects.count():064x}",
            output_index=0,
            address=address.address,
            tag=address.tag,
            amount=Decimal(amount),
            confirmations=100,
        )
    assert deposit.status == DepositStatus.NEED_FILL_DATA
    return deposit


def banned_ip(ip: str = "192.0.2.77") -> RateLimitBan:
    return ratelimit.rate_limit_ban_create(ip=ip, reason="continued after 429")


# --- the account's change page, as staff post it --------------------------------------------------


def user_form(client, user: User, **changed) -> dict:
    """The account's change form as its page shows it (its inputs' values), with `changed` on top."""
    html = client.get(reverse("admin:accounts_user_change", args=[user.pk])).content.decode()
    form = {"_save": "Save"}
    for tag in re.findall(r"<input[^>]*>", html):
        name = re.search(r'name="([^"]+)"', tag)
        if name is None or name.group(1) in ("csrfmiddlewaretoken", "reason"):
            continue
        kind = re.search(r'type="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if kind and kind.group(1) == "checkbox":
            if " checked" in tag:
                form[name.group(1)] = "on"
            continue
        form[name.group(1)] = value.group(1) if value else ""
    for select in re.finditer(r'<select name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', select.group(2))
        form[select.group(1)] = chosen.group(1) if chosen else ""
    form.update(changed)
    return form


def change_user(client, user: User, **changed):
    """Post the account's change page with `changed` (and `reason`), following the redirect."""
    url = reverse("admin:accounts_user_change", args=[user.pk])
    return client.post(url, user_form(client, user, **changed), follow=True)


def page_messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]
