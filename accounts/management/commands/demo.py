"""Load the demo world (idempotent): each app loads its own part (`<app>/demo.py`: accounts, keys,
assets and funding in accounts/demo.py; networks and the whitelist in wallet/demo.py), in the order
of settings.DEMO_LOADERS, in one transaction. `--json` prints the demo accounts' keys for scripts
and the README's examples.

Demo keys are the one place a secret is shown again (the demo must be re-runnable); the command
refuses to run under production settings.
"""

import json
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils.module_loading import import_string


class Command(BaseCommand):
    help = "Create the demo accounts and keys (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print the demo accounts and keys as JSON.")
        parser.add_argument(
            "--customers",
            type=int,
            default=0,
            help="Also K simulation customers (a master with a virtual sub-account each; harness/simulation).",
        )

    def handle(self, *args, **options):
        if (settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE", "")).endswith("production"):
            raise CommandError("The demo world is not for production.")
        world: dict[str, dict] = {}  # role -> the demo account's email and keys
        with transaction.atomic():
            for path in settings.DEMO_LOADERS:
                world.update(import_string(path)(customers=options["customers"]))
        if options["json"]:
            self.stdout.write(json.dumps(world))
        else:
            for role, entry in world.items():
                if role == "customers":
                    self.stdout.write(f"customers: {len(entry)} (with --json: their keys)")
                    continue
                self.stdout.write(f"{role}: {entry['email']} api_key={entry['api_key']}")
            self.stdout.write("Run with --json to see the secrets.")
