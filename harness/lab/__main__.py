"""`python -m harness.lab up|down|status|env|fault|hostfault|test` (docs/scaling.md)."""

from __future__ import annotations

import json
import sys

from harness.lab import cluster, topology


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    if command == "up":
        cluster.up()
        sys.stdout.write(json.dumps(cluster.status(), indent=2) + "\n")
    elif command == "down":
        cluster.down()
    elif command == "status":
        sys.stdout.write(json.dumps(cluster.status(), indent=2) + "\n")
    elif command == "env":
        for key, value in topology.app_env().items():
            sys.stdout.write(f"{key}={value}\n")
    elif command == "fault":
        from harness.lab import bank

        return bank.main(argv[1:])
    elif command == "hostfault":
        from harness.lab import hostfault

        return hostfault.main(argv[1:])
    elif command == "test":
        from harness.lab import suite

        return suite.main(argv[1:])
    else:
        raise SystemExit(f"unknown command {command!r}: up, down, status, env, fault, hostfault, test")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
