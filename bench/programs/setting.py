"""A setting's value as the stack sees it: argv `NAME ...`; prints a `NAME value` line for each
(bench/convert reads CONVERT_QUOTE_INTERVAL_MS: the service's default unless the bench set it)."""

import os
import sys


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")  # as manage.py
    import django

    django.setup()
    from django.conf import settings

    for name in argv:
        print(f"{name} {getattr(settings, name)}")


if __name__ == "__main__":
    main(sys.argv[1:])
