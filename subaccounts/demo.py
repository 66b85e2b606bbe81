"""The sub-accounts part of the demo world (idempotent), loaded after accounts' (settings.DEMO_LOADERS):
the demo master keeps two funded sub-accounts, `sub1` (from accounts.demo, with its own API key) and a
virtual `sub2` made the way the API makes them (named sub2@demo.exchange; its address is in the
reserved space, subaccounts/addresses.py); the master is whitelisted for its sub-accounts' stream
events (`em` and `BI`, docs/streams.md)."""

from __future__ import annotations

from decimal import Decimal

from accounts.demo import MASTER
from accounts.ledger.services import funding_post
from accounts.models import User
from subaccounts import services
from subaccounts.errors import SubAccountNotFound

SUB2 = "sub2@demo.exchange"
SUB2_FUNDING = {"BTC": "0.5", "USDT": "500", "PHP": "5000"}


def load(customers: int = 0) -> dict[str, dict]:  # customers: accounts.demo's
    master = User.objects.get(email=MASTER["email"])
    if not master.is_whitelisted_master:
        master.is_whitelisted_master = True
        master.save(update_fields=["is_whitelisted_master"])
    try:
        sub2 = services.sub_account_of(master=master, email=SUB2)
    except SubAccountNotFound:
        sub2 = services.sub_account_create(master=master, email=SUB2)  # sub2_demo.exchange@m<id>.<reserved>
    for code, amount in SUB2_FUNDING.items():
        funding_post(account=sub2, asset_code=code, amount=Decimal(amount), reference=f"demo:fund:{SUB2}:{code}")
    return {}
