"""The caller's address, honouring X-Forwarded-For only from TRUSTED_PROXIES."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings


@lru_cache(maxsize=8)
def _trusted_networks(entries: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries if entry.strip())


def _is_trusted(address: str, networks: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def _plain(address: str) -> str:
    """An IPv4 client seen through an IPv6 socket (::ffff:a.b.c.d) is a.b.c.d."""
    if address.startswith("::ffff:"):
        try:
            mapped = ipaddress.ip_address(address).ipv4_mapped
        except ValueError:
            return address
        if mapped is not None:
            return str(mapped)
    return address


def client_ip(meta: dict) -> str:
    return _plain(_client_ip(meta))


def _client_ip(meta: dict) -> str:
    """REMOTE_ADDR, unless it is a trusted proxy: then the right-most X-Forwarded-For hop that is
    not itself a trusted proxy (hops to its left could be forged by the client)."""
    remote = meta.get("REMOTE_ADDR") or "0.0.0.0"  # noqa: S104 - only a placeholder for a missing peer
    networks = _trusted_networks(tuple(settings.TRUSTED_PROXIES))
    if not networks or not _is_trusted(remote, networks):
        return remote
    forwarded = [hop.strip() for hop in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    for hop in reversed(forwarded):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return remote  # a malformed chain is not believed at all
        if not _is_trusted(hop, networks):
            return hop
    return forwarded[0] if forwarded else remote


class ClientIpMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.client_ip = client_ip(request.META)
        return self.get_response(request)
