"""bench/wallet's accounts: argv `count`; `count` users with a whitelisted TRX address, 1,000,000 USDT
and an API key; prints `[[api_key, secret, address], ...]` as JSON."""

import json
import sys
from decimal import Decimal


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.db import transaction

    from accounts import ledger, services
    from accounts.ledger.models import BusinessType
    from accounts.models import LedgerAccount, SystemRole, User
    from wallet.models import Network, WhitelistAddress

    count = int(argv[0])
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

    def trx_address(i):
        digits = ""
        for _ in range(8):
            i, r = divmod(i, 58)
            digits = alphabet[r] + digits
        return "TBench" + "1" * 19 + digits  # matches ^T[1-9A-HJ-NP-Za-km-z]{33}$

    with transaction.atomic():
        User.objects.bulk_create([User(email=f"w{i}@wallet.bench", password="!") for i in range(count)])
        users = list(User.objects.filter(email__endswith="@wallet.bench").order_by("id"))
        LedgerAccount.objects.bulk_create([LedgerAccount(user=u) for u in users], ignore_conflicts=True)
        network = Network.objects.get(coin__code="USDT", network="TRX")
        entries = [WhitelistAddress(account=u, network=network, address=trx_address(i)) for i, u in enumerate(users)]
        WhitelistAddress.objects.bulk_create(entries)
        equity = ledger.system_account_id(SystemRole.EQUITY)
        each = Decimal(1_000_000)
        legs = [ledger.Leg(equity, "USDT", -each * len(users))] + [ledger.Leg(u.pk, "USDT", each) for u in users]
        ledger.post(legs=legs, kind=BusinessType.DISTRIBUTION, reference="bench:wallet:funding")
        keys = [services.api_key_create(user=u, name="bench") for u in users]
    print(json.dumps([[k.api_key.key, k.secret, trx_address(i)] for i, k in enumerate(keys)]))


if __name__ == "__main__":
    main(sys.argv[1:])
