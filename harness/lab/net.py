"""The lab's network: one namespace per host, a veth pair from each to the bridge in the machine's
namespace. `cut` and `mend` take a host's link down and up (a partition)."""

from __future__ import annotations

import subprocess

from harness.lab.topology import BRIDGE, GATEWAY, HOSTS, PREFIX, PROXY_ADDRESS, Host


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)  # noqa: S603, S607


def pids(host: Host) -> list[int]:
    """Every process in `host`'s namespace (what dies with the machine)."""
    return [int(pid) for pid in ip("netns", "pids", host.netns).stdout.split()]


def up() -> None:
    if ip("link", "show", BRIDGE, check=False).returncode != 0:
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{GATEWAY}/{PREFIX}", "dev", BRIDGE)
        ip("addr", "add", f"{PROXY_ADDRESS}/{PREFIX}", "dev", BRIDGE)  # secondary: HAProxy's alone
    ip("link", "set", BRIDGE, "up")
    existing = ip("netns", "list").stdout
    for host in HOSTS:
        if host.netns in existing:
            continue
        ip("netns", "add", host.netns)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        ip("link", "set", host.veth, "master", BRIDGE, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX}", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")


def down() -> None:
    for host in HOSTS:
        ip("netns", "del", host.netns, check=False)  # its veth pair goes with it
    ip("link", "del", BRIDGE, check=False)


def cut(host: Host) -> None:
    ip("link", "set", host.veth, "down")


def mend(host: Host) -> None:
    ip("link", "set", host.veth, "up")


def in_host(host: Host, args: list[str], *, user: str | None = None) -> list[str]:
    """`args` run inside `host`'s namespace (as `user`: setpriv execs, so the pid is the program's)."""
    prefix = ["ip", "netns", "exec", host.netns]
    if user:
        prefix += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
    return prefix + args
