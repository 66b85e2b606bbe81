"""`python -m harness.demo_world`: migrate the database of this process's environment and load the demo
world in one process (one Django start instead of two `manage.py` runs); the world's JSON
(`manage.py demo --json`) is the last line printed. `services.load_demo` runs it with a stack's
environment."""

from __future__ import annotations

import os


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    call_command("demo", json=True)


if __name__ == "__main__":
    main()
