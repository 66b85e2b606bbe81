"""Middleware of the gateway: the caller's address (honouring X-Forwarded-For only from
TRUSTED_PROXIES), and the site middleware (sessions, CSRF, user, messages) kept off API paths.

The admin needs sessions, CSRF protection, the logged-in user and messages; the API needs none of
them (every /openapi/ endpoint authenticates each request itself, never with a cookie, and is
CSRF-exempt), yet they cost about a tenth of a cheap request's CPU. Their subclasses below let
API requests through untouched; every other path (the admin, the Swagger UI page and the schema it
loads) gets the full behaviour. They are subclasses so that the admin's checks still find them.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as DjangoAuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware as DjangoMessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware as DjangoSessionMiddleware
from django.middleware.csrf import CsrfViewMiddleware as DjangoCsrfViewMiddleware

API_PREFIX = "/openapi/"
# Pages under /openapi/ made for browsers: they keep the site middleware (Swagger UI sends the CSRF token).
BROWSER_PATHS = frozenset({"/openapi/docs", "/openapi/schema"})


def is_api_path(path_info: str) -> bool:
    return path_info.startswith(API_PREFIX) and path_info not in BROWSER_PATHS


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


class _SiteOnly:
    """Run the middleware this is mixed into for every path but the API's."""

    def __call__(self, request):
        if is_api_path(request.path_info):
            return self.get_response(request)  # a coroutine in async mode, awaited by the caller
        return super().__call__(request)


class SessionMiddleware(_SiteOnly, DjangoSessionMiddleware):
    pass


class CsrfViewMiddleware(_SiteOnly, DjangoCsrfViewMiddleware):
    def process_view(self, request, callback, callback_args, callback_kwargs):
        if is_api_path(request.path_info):
            return None  # every API view is CSRF-exempt anyway
        return super().process_view(request, callback, callback_args, callback_kwargs)


class AuthenticationMiddleware(_SiteOnly, DjangoAuthenticationMiddleware):
    pass


class MessageMiddleware(_SiteOnly, DjangoMessageMiddleware):
    pass
