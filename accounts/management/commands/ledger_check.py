"""`manage.py ledger_check`: recompute every balance from the journal; exit 1 on any drift."""

import sys

from django.core.management.base import BaseCommand

from accounts.ledger.check import ledger_check


class Command(BaseCommand):
    help = "Verify balances against the journal and that every posting and the book sum to zero."

    def add_arguments(self, parser):
        parser.add_argument("--record", action="store_true", help="Also store the result for the admin.")

    def handle(self, *args, **options):
        result = ledger_check(record=options["record"])
        (self.stdout if result.ok else self.stderr).write(result.report())
        if not result.ok:
            sys.exit(1)
