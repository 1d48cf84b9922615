"""Webhook URL policy: what a channel's ``options["url"]`` may point at (SSRF guard).

Rules, checked without any network access:

* the scheme is ``http`` or ``https``, the URL has a host and no credentials (put secrets in
  ``options["secret"]`` or ``options["headers"]``, which the admin keeps write-only);
* when ``WEBHOOK_ALLOWED_HOSTS`` is set, the host must match one entry: an exact name
  (``hooks.example.com``), a suffix (``.example.com``: the domain and its subdomains), an IP
  address or a network in CIDR notation (``10.1.0.0/16``);
* loopback, private, link-local, multicast, reserved and unspecified addresses — written in any
  form the resolver accepts (``127.1``, ``0x7f000001``, ``::ffff:127.0.0.1``) — and local names
  (``localhost``, ``*.local``, ``*.internal``) are refused unless allowlisted.

A name that *resolves* to a private address is only caught when ``resolve=True`` (DNS can change
after validation anyway: the policy is a configuration guard, not a connect-time filter).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from .conf import get_settings

__all__ = ["host_is_allowlisted", "webhook_url_problems"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")


def _literal_address(host: str) -> IPAddress | None:
    """The address ``host`` denotes when it is an IP literal in any form the C resolver accepts."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return address.ipv4_mapped
        return address
    # inet_aton (no network) accepts the legacy forms getaddrinfo would honour: 127.1, 0x7f.1, 2130706433.
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host) and any(c.isdigit() for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _is_internal(address: IPAddress) -> bool:
    return bool(
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    )


def host_is_allowlisted(host: str, allowed: Iterable[str]) -> bool:
    """Whether ``host`` matches an entry of ``WEBHOOK_ALLOWED_HOSTS`` (names, .suffixes, IPs, CIDRs)."""
    host = host.lower().rstrip(".")
    address = _literal_address(host)
    for raw in allowed:
        entry = str(raw).strip().lower().rstrip(".")
        if not entry:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False


def _resolve(host: str) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def webhook_url_problems(
    url: str,
    *,
    allowed_hosts: Iterable[str] | None = None,
    resolve: bool | Callable[[str], list[IPAddress]] = False,
) -> list[str]:
    """Why ``url`` may not be used as a webhook target; empty when it may.

    ``allowed_hosts`` defaults to the ``WEBHOOK_ALLOWED_HOSTS`` setting. ``resolve=True`` also
    looks the name up (DNS) and refuses internal addresses it resolves to; a callable replaces
    the resolver (tests).
    """
    if not isinstance(url, str) or not url.strip():
        return ["the webhook URL is empty"]
    allowed = tuple(get_settings().WEBHOOK_ALLOWED_HOSTS if allowed_hosts is None else allowed_hosts)
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").rstrip(".")
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        return [f"the webhook URL cannot be parsed: {exc}"]
    problems: list[str] = []
    if parts.scheme not in ("http", "https"):
        problems.append(f"the webhook URL must use http or https, not {parts.scheme or 'no scheme'!r}")
    if not host:
        problems.append("the webhook URL has no host")
        return problems
    if parts.username is not None or parts.password is not None:
        problems.append("the webhook URL must not carry credentials; use the channel's secret or headers")
    if host_is_allowlisted(host, allowed):
        return problems
    if allowed:
        problems.append(f"host {host!r} is not in WEBHOOK_ALLOWED_HOSTS")
    address = _literal_address(host)
    if address is not None:
        if _is_internal(address):
            problems.append(
                f"host {host!r} is an internal address ({address}); allowlist it in WEBHOOK_ALLOWED_HOSTS "
                "to use it"
            )
        return problems
    if host in LOCAL_NAMES or host.endswith(LOCAL_SUFFIXES) or "." not in host:
        problems.append(f"host {host!r} is a local name; allowlist it in WEBHOOK_ALLOWED_HOSTS to use it")
        return problems
    if resolve:
        resolver = resolve if callable(resolve) else _resolve
        try:
            addresses = resolver(host)
        except OSError as exc:
            problems.append(f"host {host!r} does not resolve: {exc}")
            return problems
        internal = sorted({str(a) for a in addresses if _is_internal(a)})
        if internal:
            problems.append(
                f"host {host!r} resolves to internal address(es) {', '.join(internal)}; allowlist it"
            )
    return problems
