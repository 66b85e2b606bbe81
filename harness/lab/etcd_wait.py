"""Patroni's start on a db host of the HA lab: wait until etcd's cluster version is decided, then become
Patroni (`exec`: the pid supervisord holds is Patroni's).

    /usr/bin/python3 etcd_wait.py VERSION_URL PATRONI PATRONI_YML

Patroni with `use_proxies` asks the first etcd member for the cluster's version at start and dies on
etcd's "not_decided" (before the members' first election; seen with Debian's 3.0.2, kept for 4.0,
where it costs nothing), and the lab does not restart a dead program. User postgres runs this file
with Debian's Python (a Python under /root is not theirs to run), so it imports nothing but the
standard library; `cluster.write_files` copies it into the host's directory, which user postgres owns.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

POLL_SECONDS = 0.5


def decided(url: str) -> bool:
    """etcd's /version answers; its cluster version is no longer "not_decided"."""
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:  # noqa: S310 - the lab's own etcd, over http
            return json.load(answer)["etcdcluster"] != "not_decided"
    except (OSError, ValueError, KeyError):
        return False


def main(argv: list[str]) -> None:
    url, program, *arguments = argv
    while not decided(url):
        time.sleep(POLL_SECONDS)
    os.execv(program, [program, *arguments])  # noqa: S606 - Patroni from the lab's own virtualenv


if __name__ == "__main__":
    main(sys.argv[1:])
