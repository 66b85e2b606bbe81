"""`manage.py sync_roles`: write the staff roles of exchange/backoffice/roles.py now (migrate does it too)."""

from django.core.management.base import BaseCommand

from exchange.backoffice.roles import LEGACY_GROUPS, ROLES, sync_roles


class Command(BaseCommand):
    help = "Create or correct the staff groups (Support, Treasury, Administrator); fold in the legacy groups."

    def handle(self, *args, **options):
        moved = sync_roles()
        self.stdout.write(f"Roles: {', '.join(ROLES)}.")
        for legacy_name, count in moved.items():
            self.stdout.write(
                f"Legacy group {legacy_name!r}: {count} member(s) moved to {LEGACY_GROUPS[legacy_name]!r}."
            )
