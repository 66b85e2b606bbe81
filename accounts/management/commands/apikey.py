"""Operators' API-key tool: `manage.py apikey create EMAIL [--type T ...] [--ip IP ...] [--name N]`.

The secret is printed once; it is stored encrypted and cannot be shown again.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from accounts import services
from accounts.models import ApiKey, ApiKeyType, User


class Command(BaseCommand):
    help = "Create, disable or enable API keys."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a key for the account with this e-mail.")
        create.add_argument("email")
        create.add_argument("--name", default="operator-created")
        create.add_argument(
            "--type",
            action="append",
            dest="types",
            default=[],
            choices=ApiKeyType.values,
            help="Repeat for several types; none means every functional type.",
        )
        create.add_argument("--ip", action="append", dest="ips", default=[], help="Restrict to this IP or CIDR.")
        create.add_argument("--json", action="store_true")
        for action in ("disable", "enable"):
            cmd = sub.add_parser(action, help=f"{action.capitalize()} a key.")
            cmd.add_argument("key")

    def handle(self, *args, **options):
        action = options["action"]
        if action == "create":
            user = User.objects.filter(email=options["email"].lower()).first()
            if user is None:
                raise CommandError(f"No account with e-mail {options['email']}")
            try:
                created = services.api_key_create(
                    user=user, name=options["name"], types=options["types"], ip_list=options["ips"]
                )
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
            payload = {
                "email": user.email,
                "api_key": created.api_key.key,
                "secret_key": created.secret,
                "types": created.api_key.types,
                "ip_list": created.api_key.ip_list,
            }
            if options["json"]:
                self.stdout.write(json.dumps(payload))
            else:
                for name, value in payload.items():
                    self.stdout.write(f"{name}: {value}")
                self.stdout.write("The secret is shown only now; store it safely.")
            return
        api_key = ApiKey.objects.filter(key=options["key"]).first()
        if api_key is None:
            raise CommandError("No such key")
        services.api_key_set_status(api_key=api_key, enabled=action == "enable")
        self.stdout.write(f"{api_key} {api_key.status}")
