"""bench/streams' accounts: argv `count`; `count` users, each with a listenKey, made in one transaction;
prints `[[id, listenKey], ...]` as JSON."""

import json
import sys


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.db import transaction

    from accounts import services
    from streams.services import listen_key_start

    out = []
    with transaction.atomic():
        for i in range(int(argv[0])):
            user = services.user_create(email=f"stream-bench-{i}@bench.example", password=None)
            out.append([user.pk, listen_key_start(account=user)])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
