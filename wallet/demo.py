"""The wallet part of the demo world (idempotent), loaded after accounts' (settings.DEMO_LOADERS):
the networks BTC (BTC), ETH (ETH), USDT (ETH, TRX) and a withdrawal whitelist entry of the demo
master per crypto coin and network.
"""

from __future__ import annotations

from decimal import Decimal

from accounts.demo import MASTER, customer_emails
from accounts.models import Asset, User
from wallet.models import Network, WhitelistAddress

NETWORKS = [
    # coin, network, name, address regex, min confirmations, fee, min, multiple
    ("BTC", "BTC", "Bitcoin", r"^(bc1|[13])[a-zA-HJ-NP-Z0-9]{25,62}$", 2, "0.0005", "0.001", "0.00000001"),
    ("ETH", "ETH", "Ethereum (ERC20)", r"^(0x)[0-9A-Fa-f]{40}$", 6, "0.005", "0.01", "0.00000001"),
    ("USDT", "ETH", "Ethereum (ERC20)", r"^(0x)[0-9A-Fa-f]{40}$", 6, "5", "10", "0.000001"),
    ("USDT", "TRX", "Tron (TRC20)", r"^T[1-9A-HJ-NP-Za-km-z]{33}$", 3, "1", "10", "0.000001"),
]
WHITELIST = {
    "BTC": "bc1qdemo0master0whitelist0address0000000",
    "ETH": "0x00000000000000000000000000000000000d3e40",
    "TRX": "TDemoMasterWhitezistAddress1111111",
}


def _networks() -> None:
    for coin, network, name, regex, confirmations, fee, minimum, multiple in NETWORKS:
        Network.objects.get_or_create(
            coin=Asset.objects.get(code=coin),
            network=network,
            defaults={
                "name": name,
                "address_regex": regex,
                "min_confirm": confirmations,
                "withdraw_fee": Decimal(fee),
                "withdraw_min": Decimal(minimum),
                "withdraw_integer_multiple": Decimal(multiple),
                "withdraw_max": Decimal("1000000"),
            },
        )


def _whitelist(user: User) -> None:
    for network in Network.objects.select_related("coin"):
        WhitelistAddress.objects.get_or_create(
            account=user,
            network=network,
            address=WHITELIST[network.network],
            tag="",
            defaults={"name": f"demo {network.coin.code} {network.network}"},
        )


def load(customers: int = 0) -> dict[str, dict]:
    """Networks and the whitelist of the master (and of the simulation's customers); adds no account
    to the world."""
    _networks()
    for email in [MASTER["email"], *customer_emails(customers)]:
        _whitelist(User.objects.get(email=email))
    return {}
