"""`manage.py deposit EMAIL COIN AMOUNT --network NET [--tx-id ID]`: someone sends coins to the
account's deposit address on the simulated chain; the deposit is recorded through the same path as
the chain scan (PROCESSING until the network's minConfirm, then credited once)."""

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from exchange.api.errors import ExchangeError
from exchange.api.formatting import amount as amount_text
from wallet import deposits
from wallet.chain import adapter
from wallet.chain.simulator import send_to
from wallet.models import SimTransaction


class Command(BaseCommand):
    help = "Simulate an incoming deposit to an account's deposit address."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("coin")
        parser.add_argument("amount")
        parser.add_argument("--network", required=True)
        parser.add_argument("--tx-id", default=None)
        parser.add_argument("--confirm", action="store_true", help="Also mine enough blocks to confirm it now.")

    def handle(self, *args, **options):
        if not settings.CHAIN_ADAPTER.endswith("SimulatedChain"):
            raise CommandError("Deposits can only be simulated on the simulated chain.")
        user = User.objects.filter(email=options["email"].lower()).first()
        if user is None:
            raise CommandError(f"No account with e-mail {options['email']}")
        try:
            amount = Decimal(options["amount"])
        except InvalidOperation as exc:
            raise CommandError("AMOUNT must be a decimal number") from exc
        if amount <= 0:
            raise CommandError("AMOUNT must be positive")
        try:
            address = deposits.deposit_address_get(account=user, coin=options["coin"], network=options["network"])
        except ExchangeError as exc:
            raise CommandError(exc.msg) from exc
        network = address.network
        tx = None
        if options["tx_id"]:  # the same transaction again: record it again (idempotent), never a second one
            tx = SimTransaction.objects.filter(network=network.network, tx_id=options["tx_id"], output_index=0).first()
            if tx is not None and (tx.address, tx.tag, tx.amount) != (address.address, address.tag, amount):
                raise CommandError(f"Transaction {options['tx_id']} exists with another address or amount.")
        if tx is None:
            tx = send_to(
                network=network.network, address=address.address, tag=address.tag, amount=amount, tx_id=options["tx_id"]
            )
        if options["confirm"]:
            from wallet.chain.simulator import advance_blocks

            advance_blocks(max(0, network.min_confirm - 1), network=network.network)
        seen = {
            (s.tx_id, s.output_index): s
            for s in adapter().scan(network=network, addresses={(address.address, address.tag): user.pk})
        }
        found = seen[(tx.tx_id, tx.output_index)]
        deposit = deposits.deposit_record(
            network=network,
            tx_id=found.tx_id,
            output_index=found.output_index,
            address=found.address,
            tag=found.tag,
            amount=found.amount,
            confirmations=found.confirmations,
            failed=found.failed,
        )
        self.stdout.write(
            f"deposit #{deposit.pk} {amount_text(deposit.amount, network.coin.transfer_precision)} {network} "
            f"tx {deposit.tx_id} "
            f"status {deposit.get_status_display()} ({deposit.confirmations}/{network.min_confirm} confirmations)"
        )
