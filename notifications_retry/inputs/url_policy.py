"""Webhook URL policy: what a channel's ``options["url"]`` may point at (the SSRF guard).

Rules (docs/providers.md has the table):

* the scheme is ``http`` or ``https``, the URL has a host and no credentials (put secrets in
  ``options["secret"]`` or ``options["headers"]``, which the admin keeps write-only);
* when ``WEBHOOK_ALLOWED_HOSTS`` is set, the host must match one entry: an exact name
  (``hooks.example.com``), a suffix (``.example.com``: the domain and its subdomains), an IP
  address or a network in CIDR notation (``10.1.0.0/16``) — or the entry ``"*"`` (:data:`ANY_PUBLIC`)
  admits every public host as an empty allowlist does, so ``["*", "127.0.0.1"]`` adds a local receiver
  to the public ones instead of replacing them;
* an internal address — every range :mod:`ipaddress` knows as not globally reachable (private,
  loopback, link-local, shared ``100.64.0.0/10``, reserved, multicast, unspecified, site-local,
  documentation and benchmarking ranges), and an IPv6 address embedding an internal IPv4 one
  (IPv4-mapped, 6to4, NAT64, Teredo, IPv4-compatible) — is refused unless allowlisted, in every
  spelling the resolver accepts (``127.1``, ``0x7f.1``, ``0177.0.0.1``, ``2130706433``, full-width
  digits, which IDNA folds to ASCII), and so are local names (``localhost``, ``*.localhost``,
  ``*.local``, ``*.internal``, single-label names).

Where it is enforced: :func:`webhook_url_problems` at model validation, in the admin form, in
``manage.py check`` and on every send; :func:`address_problem` at connect time, on the address the
connection actually goes to (after DNS), so a public-looking name that resolves inside is refused
too. An allowlisted *name* is trusted whatever it resolves to; an allowlisted IP or network admits
that address for any allowed name.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import ipaddress
import socket
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from urllib.parse import urlsplit

from notifications_retry.conf import get_settings

__all__ = [
    "ANY_PUBLIC",
    "address_problem",
    "host_is_allowlisted",
    "internal_reason",
    "literal_address",
    "normalize_host",
    "resolution_problems",
    "resolved_beforehand",
    "webhook_url_problems",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], list[IPAddress]]

LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")
#: Seconds a validation-time DNS lookup may take (``check``, model validation); connect time has the
#: request's own deadline.
RESOLVE_TIMEOUT_SECONDS = 2.0

_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


def normalize_host(host: str) -> str:
    """``host`` as the resolver sees it: IDNA-folded (full-width digits and dots become ASCII), lower case."""
    host = host.strip()
    try:
        folded = host.encode("idna").decode("ascii")
    except UnicodeError:
        folded = unicodedata.normalize("NFKC", host)
    return folded.lower().rstrip(".")


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` denotes when it is an IP literal in any form the C resolver accepts."""
    host = normalize_host(host).strip("[]")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) names no other host
    except ValueError:
        pass
    # inet_aton (no network) accepts the legacy forms getaddrinfo honours: 127.1, 0x7f.1, 0177.0.0.1,
    # 2130706433. Only hex digits, x and dots can make one; anything else is a name.
    if host and all(c in "0123456789abcdefx." for c in host) and any(c.isdigit() for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _v4_reason(address: ipaddress.IPv4Address) -> str | None:
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address in _SHARED:
        return "shared address space (100.64.0.0/10)"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "not globally reachable"
    return None


def internal_reason(address: IPAddress) -> str | None:
    """Why ``address`` is internal (its class), or None for a globally reachable one."""
    if isinstance(address, ipaddress.IPv4Address):
        return _v4_reason(address)
    embedded: list[tuple[str, ipaddress.IPv4Address]] = []
    if address.ipv4_mapped is not None:
        embedded.append(("IPv4-mapped", address.ipv4_mapped))
    if address in _NAT64:
        embedded.append(("NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)))
    if address.sixtofour is not None:
        embedded.append(("6to4", address.sixtofour))
    if address.teredo is not None:
        embedded.extend(("Teredo", part) for part in address.teredo)
    if address in _COMPATIBLE and int(address) > 1:
        embedded.append(("IPv4-compatible", ipaddress.IPv4Address(int(address))))
    for form, v4 in embedded:
        reason = _v4_reason(v4)
        if reason is not None:
            return f"{form} {v4}: {reason}"
    if address.ipv4_mapped is not None or address in _NAT64 or address.sixtofour is not None:
        # Its public IPv4 address decides (Python 3.13 calls all 6to4 private, 3.11 and 3.12 global).
        return None
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_site_local:
        return "site-local"
    if address.is_multicast:
        return "multicast"
    if address in _NAT64_LOCAL:
        return "local-use NAT64"
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "not globally reachable"
    return None


#: The allowlist entry that keeps every public host allowed (what an empty allowlist allows): an
#: allowlist is otherwise exclusive, and allowing 127.0.0.1 alone refuses every public webhook.
ANY_PUBLIC = "*"


def _entries(allowed: Iterable[str]) -> tuple[str, ...]:
    return tuple(e for e in (normalize_host(str(raw)) for raw in allowed) if e)


def _address_allowlisted(address: IPAddress, entries: Iterable[str]) -> bool:
    candidates = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)
    for entry in entries:
        if entry.startswith("."):
            continue
        try:
            network = ipaddress.ip_network(entry.strip("[]"), strict=False)
        except ValueError:
            continue
        if any(a.version == network.version and a in network for a in candidates):
            return True
    return False


def _name_allowlisted(host: str, entries: Iterable[str]) -> bool:
    for entry in entries:
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False


def host_is_allowlisted(host: str, allowed: Iterable[str]) -> bool:
    """Whether ``host`` matches an entry of ``WEBHOOK_ALLOWED_HOSTS`` (names, .suffixes, IPs, CIDRs)."""
    host = normalize_host(host).strip("[]")
    entries = _entries(allowed)
    address = literal_address(host)
    if address is not None:
        return _address_allowlisted(address, entries)
    return _name_allowlisted(host, entries)


def _allowed(allowed_hosts: Iterable[str] | None) -> tuple[str, ...]:
    return tuple(get_settings().WEBHOOK_ALLOWED_HOSTS if allowed_hosts is None else allowed_hosts)


def webhook_url_problems(
    url: object,
    *,
    allowed_hosts: Iterable[str] | None = None,
    resolve: bool | Resolver = False,
) -> list[str]:
    """Why ``url`` may not be used as a webhook target; empty when it may.

    ``allowed_hosts`` defaults to the ``WEBHOOK_ALLOWED_HOSTS`` setting. ``resolve=True`` also
    looks the name up (DNS) and refuses internal addresses it resolves to (a failed lookup is a
    problem here); a callable replaces the resolver (tests). Without ``resolve`` no network is used.
    """
    if not isinstance(url, str):
        return ["the webhook URL is empty"]
    allowed = _allowed(allowed_hosts)
    try:
        problems = list(_static_problems(url, allowed))
    except TypeError:  # an unhashable allowlist entry (settings check E001 names it): no memo
        problems = list(_static_problems.__wrapped__(url, allowed))
    if problems or not resolve:
        return problems
    host = _host(url)
    resolver = resolve if callable(resolve) else _resolve
    try:
        addresses = resolver(host)
    except OSError as exc:
        return [f"host {host!r} does not resolve: {exc}"]
    return _resolved_problems(host, addresses, allowed)


@functools.lru_cache(maxsize=512)
def _static_problems(url: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The checks that need no network, memoized: every send asks them again."""
    if not url.strip():
        return ("the webhook URL is empty",)
    try:
        parts = urlsplit(url.strip())
        raw_host = parts.hostname or ""
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        return (f"the webhook URL cannot be parsed: {exc}",)
    problems: list[str] = []
    if parts.scheme not in ("http", "https"):
        problems.append(f"the webhook URL must use http or https, not {parts.scheme or 'no scheme'!r}")
    host = normalize_host(raw_host)
    if not host:
        problems.append("the webhook URL has no host")
        return tuple(problems)
    if parts.username is not None or parts.password is not None:
        problems.append("the webhook URL must not carry credentials; use the channel's secret or headers")
    if host_is_allowlisted(host, allowed):
        return tuple(problems)
    if allowed and ANY_PUBLIC not in _entries(allowed):
        problems.append(
            f"host {host!r} is not in WEBHOOK_ALLOWED_HOSTS (a non-empty allowlist admits only what it "
            f"lists; add {ANY_PUBLIC!r} to it to admit every public host as well)"
        )
    address = literal_address(host)
    if address is not None:
        reason = internal_reason(address)
        if reason is not None:
            problems.append(
                f"host {raw_host!r} is an internal address ({address}: {reason}); allowlist it in "
                "WEBHOOK_ALLOWED_HOSTS to use it"
            )
        return tuple(problems)
    if host in LOCAL_NAMES or host.endswith(LOCAL_SUFFIXES) or "." not in host:
        problems.append(f"host {host!r} is a local name; allowlist it in WEBHOOK_ALLOWED_HOSTS to use it")
    return tuple(problems)


def _host(url: str) -> str:
    return normalize_host(urlsplit(url.strip()).hostname or "")


def _resolve(host: str) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def _resolved_problems(host: str, addresses: Iterable[IPAddress], allowed: tuple[str, ...]) -> list[str]:
    if literal_address(host) is not None or _name_allowlisted(host, _entries(allowed)):
        return []
    entries = _entries(allowed)
    refused = sorted({f"{a} ({reason})" for a in addresses if (reason := _refused_class(a, host, entries))})
    if refused:
        return [
            f"host {host!r} resolves to internal address(es) {', '.join(refused)}; allowlist it in "
            "WEBHOOK_ALLOWED_HOSTS to use it"
        ]
    return []


def resolution_problems(
    url: object,
    *,
    allowed_hosts: Iterable[str] | None = None,
    resolver: Resolver | None = None,
    timeout: float = RESOLVE_TIMEOUT_SECONDS,
) -> list[str]:
    """Internal addresses ``url``'s host resolves to now; a lookup that fails or is slow says nothing.

    For validation (``check``, the model): a name that does not resolve today is no SSRF risk, and the
    connect-time guard refuses what it resolves to later anyway.
    """
    if not isinstance(url, str) or webhook_url_problems(url, allowed_hosts=allowed_hosts):
        return []
    host = _host(url)
    if not host or literal_address(host) is not None:
        return []
    answered = _answers.get()
    if answered is not None and host in answered:
        addresses = answered[host]
    else:
        addresses = _lookup_within(resolver or _resolve, host, timeout)
    if addresses is None:
        return []
    return _resolved_problems(host, addresses, _allowed(allowed_hosts))


#: Lookups made by :func:`resolved_beforehand` for the code running inside it: host -> addresses
#: (None: no answer in time).
_answers: contextvars.ContextVar[Mapping[str, list[IPAddress] | None] | None] = contextvars.ContextVar(
    "notifications_retry_resolved_hosts", default=None
)


@contextlib.contextmanager
def resolved_beforehand(
    urls: Iterable[object],
    *,
    allowed_hosts: Iterable[str] | None = None,
    resolver: Resolver | None = None,
    timeout: float = RESOLVE_TIMEOUT_SECONDS,
) -> Iterator[None]:
    """Look up the hosts of ``urls`` now; :func:`resolution_problems` inside the block uses the answers.

    For validation that runs inside a database transaction (the admin saves a channel in one): a DNS
    lookup is a network call, which must not hold a transaction open, so it is made before.
    """
    answers: dict[str, list[IPAddress] | None] = dict(_answers.get() or {})
    for url in urls:
        if not isinstance(url, str) or webhook_url_problems(url, allowed_hosts=allowed_hosts):
            continue  # refused as written: resolution_problems looks nothing up for it
        host = _host(url)
        if host and host not in answers and literal_address(host) is None:
            answers[host] = _lookup_within(resolver or _resolve, host, timeout)
    token = _answers.set(answers)
    try:
        yield
    finally:
        _answers.reset(token)


def _lookup_within(resolver: Resolver, host: str, timeout: float) -> list[IPAddress] | None:
    """``resolver(host)`` on a daemon thread: None when it fails or outlives ``timeout``.

    A daemon thread, not a pool's: a lookup stuck in getaddrinfo must not hold the process at exit.
    """
    found: list[list[IPAddress]] = []

    def run() -> None:
        with contextlib.suppress(OSError, ValueError, UnicodeError):  # no answer: nothing to report
            found.append(resolver(host))

    thread = threading.Thread(target=run, name="notifications-retry-dns", daemon=True)
    thread.start()
    thread.join(timeout)
    return found[0] if found else None


def address_problem(address: str, host: str, allowed_hosts: Iterable[str] | None = None) -> str | None:
    """Why a connection to ``address`` (resolved from ``host``) is refused; None when it may go ahead.

    The connect-time half of the policy: an allowlisted name may go anywhere it resolves to; an
    allowlisted address or network is admitted; any other internal address is refused.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    reason = _refused_class(ip, host, _entries(_allowed(allowed_hosts)))
    if reason is None:
        return None
    return f"{ip} is an internal address ({reason}); allowlist it in WEBHOOK_ALLOWED_HOSTS to use it"


def _refused_class(ip: IPAddress, host: str, entries: tuple[str, ...]) -> str | None:
    host = normalize_host(host).strip("[]")
    if literal_address(host) is None and _name_allowlisted(host, entries):
        return None
    if _address_allowlisted(ip, entries):
        return None
    return internal_reason(ip)
