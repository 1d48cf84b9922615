"""The webhook URL policy as a pure function: every class of internal target, every spelling, the allowlist.

The same corpus is refused at model validation, by ``check`` and on the send itself in
tests/integration/test_webhook_ssrf.py; here the policy alone, without network or database.
"""

# ruff: noqa: RUF001  (full-width digits are the point: hosts spelled to slip past the policy)
from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from notifications_retry.inputs.url_policy import (
    address_problem,
    host_is_allowlisted,
    internal_reason,
    literal_address,
    normalize_host,
    resolution_problems,
    resolved_beforehand,
    webhook_url_problems,
)

#: Hosts the policy refuses without any lookup, one entry per class (docs/providers.md's table).
STATIC_CORPUS: dict[str, list[str]] = {
    "private": ["10.0.0.5", "172.16.3.4", "192.168.1.1", "[fd12:3456::1]"],
    "loopback": ["127.0.0.1", "127.0.0.2", "[::1]"],
    "link-local": ["169.254.169.254", "[fe80::1]", "[fe80::1%25eth0]"],
    "shared": ["100.64.0.1", "100.100.100.200"],
    "reserved": ["240.0.0.1", "255.255.255.255"],
    "multicast": ["224.0.0.1", "239.255.255.250", "[ff02::1]"],
    "unspecified": ["0.0.0.0", "[::]", "0"],
    "site-local": ["[fec0::1]"],
    "not-global": ["192.0.2.10", "198.18.0.1"],
    "ipv4-mapped": ["[::ffff:127.0.0.1]", "[::ffff:a9fe:a9fe]", "[::ffff:10.0.0.1]"],
    "6to4": ["[2002:7f00:1::]", "[2002:a9fe:a9fe::1]", "[2002:a00:1::]"],
    "nat64": ["[64:ff9b::7f00:1]", "[64:ff9b::a9fe:a9fe]", "[64:ff9b:1::a00:1]"],
    "ipv4-compatible": ["[::127.0.0.1]", "[::a00:1]"],
    "teredo": ["[2001:0:4136:e378:8000:63bf:80ff:fffe]"],
    "decimal": ["2130706433", "167772161"],
    "octal": ["0177.0.0.1", "017700000001", "0251.0376.0251.0376"],
    "hex": ["0x7f.1", "0x7f000001", "0X7F.0.0.1", "0xa9.0xfe.0xa9.0xfe"],
    "short": ["127.1", "10.1", "127.0.1"],
    "full-width": ["１２７．０．０．１", "１２７.０.０.１", "１６９．２５４．１６９．２５４"],
    "trailing-dot": ["127.0.0.1.", "localhost."],
    "local-names": ["localhost", "LOCALHOST", "api.localhost", "printer.local", "metadata.google.internal"],
    "single-label": ["intranet", "db"],
}


def url(host: str, port: int = 8080) -> str:
    return f"http://{host}:{port}/hook"


@pytest.mark.parametrize("kind", STATIC_CORPUS)
def test_every_internal_class_is_refused_without_an_allowlist(kind: str) -> None:
    for host in STATIC_CORPUS[kind]:
        problems = webhook_url_problems(url(host), allowed_hosts=())
        assert problems, f"{kind}: {host} passed"
        assert any("internal address" in p or "local name" in p for p in problems), problems


@pytest.mark.parametrize(
    "target",
    [
        "https://hooks.example.com/notify",
        "http://8.8.8.8/x",
        "http://[2606:4700:4700::1111]/x",
        "http://[::ffff:8.8.8.8]/x",  # mapped public address
        "http://[64:ff9b::808:808]/x",  # NAT64 of a public address (an IPv6-only network's way out)
        "http://[2002:808:808::1]/x",  # 6to4 of a public address
        "http://0127.0.0.1/x",  # octal 0127 = 87: public
        "http://xn--bcher-kva.example/x",
    ],
)
def test_public_targets_pass(target: str) -> None:
    assert webhook_url_problems(target, allowed_hosts=()) == []


@pytest.mark.parametrize(
    "target",
    [
        "gopher://hooks.example.com/",
        "file:///etc/passwd",
        "https://user:pass@hooks.example.com/",
        "",
        "http://",
    ],
)
def test_wrong_scheme_credentials_or_no_host(target: str) -> None:
    assert webhook_url_problems(target, allowed_hosts=()) != []


def test_not_a_string_is_refused() -> None:
    assert webhook_url_problems(None, allowed_hosts=()) == ["the webhook URL is empty"]


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("１２７．０．０．１", "127.0.0.1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("hooks.example.com", None),
        ("deadbeef", None),  # hex letters without a digit-led form: a name
        ("1.2.3.4.5", None),
    ],
)
def test_literal_spellings(host: str, expected: str | None) -> None:
    # Compared as addresses: Python 3.13 writes an IPv4-mapped one as ::ffff:127.0.0.1.
    address = literal_address(host)
    assert address == (ipaddress.ip_address(expected) if expected is not None else None)


def test_normalize_host_folds_idna_and_case() -> None:
    assert normalize_host("ＬＯＣＡＬＨＯＳＴ.") == "localhost"
    assert normalize_host("Bücher.Example") == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("address", "fragment"),
    [
        ("100.64.0.1", "shared"),
        ("::ffff:127.0.0.1", "IPv4-mapped 127.0.0.1: loopback"),
        ("2002:7f00:1::", "6to4 127.0.0.1: loopback"),
        ("64:ff9b::a9fe:a9fe", "NAT64 169.254.169.254: link-local"),
        ("::a00:1", "IPv4-compatible 10.0.0.1: private"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo 127.0.0.1: loopback"),
        ("fec0::1", "site-local"),
        ("64:ff9b:1::1", "local-use NAT64"),
    ],
)
def test_internal_reason_names_the_class(address: str, fragment: str) -> None:
    reason = internal_reason(ipaddress.ip_address(address))
    assert reason is not None and fragment in reason


def test_allowlist_rules() -> None:
    assert webhook_url_problems("http://127.0.0.1:9000/hook", allowed_hosts=["127.0.0.1"]) == []
    assert webhook_url_problems("http://0x7f.1:9000/hook", allowed_hosts=["127.0.0.1"]) == []
    assert webhook_url_problems("http://10.1.2.3/hook", allowed_hosts=["10.1.0.0/16"]) == []
    assert webhook_url_problems("http://10.2.0.1/hook", allowed_hosts=["10.1.0.0/16"]) != []
    assert webhook_url_problems("http://[::ffff:10.1.0.9]/hook", allowed_hosts=["10.1.0.0/16"]) == []
    assert webhook_url_problems("https://a.b.example.com/", allowed_hosts=[".example.com"]) == []
    assert webhook_url_problems("https://example.com.evil.org/", allowed_hosts=[".example.com"]) != []
    assert webhook_url_problems("http://receiver.internal/", allowed_hosts=["receiver.internal"]) == []
    assert host_is_allowlisted("HOOKS.Example.COM.", ["hooks.example.com"])
    assert not host_is_allowlisted("127.0.0.1", ["localhost"])  # a name entry never admits an address
    # An allowlist is exclusive: a public host outside it is refused too.
    assert (
        "not in WEBHOOK_ALLOWED_HOSTS"
        in webhook_url_problems("https://other.example.com/", allowed_hosts=["hooks.example.com"])[0]
    )


def test_allowlist_defaults_to_the_setting(settings: Any) -> None:
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}
    assert webhook_url_problems("https://hooks.example.com/x") == []
    assert "not in WEBHOOK_ALLOWED_HOSTS" in webhook_url_problems("https://other.example.com/x")[0]
    settings.NOTIFICATIONS_RETRY = {}
    assert webhook_url_problems("https://other.example.com/x") == []


def test_connect_time_half() -> None:
    assert address_problem("93.184.215.14", "hooks.example.com", ()) is None
    assert "loopback" in (address_problem("127.0.0.1", "hooks.example.com", ()) or "")
    assert "IPv4-mapped" in (address_problem("::ffff:127.0.0.1", "hooks.example.com", ()) or "")
    # An allowlisted name goes wherever it resolves; an allowlisted network admits its addresses.
    assert address_problem("10.0.0.7", "hooks.example.com", ["hooks.example.com"]) is None
    assert address_problem("10.0.0.7", "hooks.example.com", [".example.com"]) is None
    assert address_problem("10.0.0.7", "10.0.0.7", ["10.0.0.0/8"]) is None
    assert address_problem("10.0.0.7", "hooks.example.com", ["10.0.0.0/8"]) is None
    assert address_problem("10.9.0.7", "hooks.example.com", ["10.0.0.0/16"]) is not None
    # An allowlisted address literal does not vouch for another address.
    assert address_problem("127.0.0.2", "127.0.0.1", ["127.0.0.1"]) is not None


def test_resolution_problems_with_an_injected_resolver() -> None:
    def inside(host: str) -> list[Any]:
        return [ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("10.0.0.7")]

    def broken(host: str) -> list[Any]:
        raise OSError("no DNS here")

    problems = resolution_problems("https://sneaky.example.com/", allowed_hosts=(), resolver=inside)
    assert problems and "10.0.0.7 (private)" in problems[0]
    assert resolution_problems("https://sneaky.example.com/", allowed_hosts=(), resolver=broken) == []
    assert (
        resolution_problems(
            "https://sneaky.example.com/", allowed_hosts=["sneaky.example.com"], resolver=inside
        )
        == []
    )
    assert resolution_problems("http://127.0.0.1/", allowed_hosts=["127.0.0.1"], resolver=inside) == []
    # resolve= on the full check: a failed lookup is a problem there.
    assert webhook_url_problems("https://sneaky.example.com/", allowed_hosts=(), resolve=inside) != []
    assert (
        "does not resolve"
        in webhook_url_problems("https://x.example.com/", allowed_hosts=(), resolve=broken)[0]
    )
    assert webhook_url_problems("https://sneaky.example.com/", allowed_hosts=()) == []  # no lookup by default


def test_lookups_made_beforehand_answer_inside_the_block() -> None:
    asked: list[str] = []

    def inside(host: str) -> list[Any]:
        asked.append(host)
        return [ipaddress.ip_address("10.0.0.7")]

    def must_not_run(host: str) -> list[Any]:
        raise AssertionError(f"looked {host} up again inside the block")

    urls = ["https://sneaky.example.com/a", "https://sneaky.example.com/b", "ftp://x.example.com/", 7, None]
    with resolved_beforehand(urls, allowed_hosts=(), resolver=inside):
        assert asked == ["sneaky.example.com"]  # once per host; refused or odd URLs are not looked up
        problems = resolution_problems(
            "https://sneaky.example.com/c", allowed_hosts=(), resolver=must_not_run
        )
        assert problems and "10.0.0.7 (private)" in problems[0]
        # A host not looked up beforehand is looked up as usual.
        assert resolution_problems("https://other.example.com/", allowed_hosts=(), resolver=inside)
    assert asked == ["sneaky.example.com", "other.example.com"]
    # Outside the block the answers are gone: a lookup again.
    resolution_problems("https://sneaky.example.com/", allowed_hosts=(), resolver=inside)
    assert asked[-1] == "sneaky.example.com" and len(asked) == 3


def test_a_lookup_beforehand_without_an_answer_says_nothing_and_is_not_repeated() -> None:
    def broken(host: str) -> list[Any]:
        raise OSError("no DNS here")

    def must_not_run(host: str) -> list[Any]:
        raise AssertionError("looked up again")

    with resolved_beforehand(["https://gone.example.com/"], allowed_hosts=(), resolver=broken):
        assert resolution_problems("https://gone.example.com/", allowed_hosts=(), resolver=must_not_run) == []


def test_a_slow_resolver_says_nothing_after_the_timeout() -> None:
    import threading

    release = threading.Event()

    def slow(host: str) -> list[Any]:
        release.wait(5)
        return [ipaddress.ip_address("10.0.0.1")]

    try:
        assert (
            resolution_problems("https://slow.example.com/", allowed_hosts=(), resolver=slow, timeout=0.1)
            == []
        )
    finally:
        release.set()


def test_unhashable_allowlist_entries_do_not_break_the_check() -> None:
    assert webhook_url_problems("http://10.0.0.1/", allowed_hosts=[["10.0.0.1"]]) != []  # type: ignore[list-item]


def test_an_allowlist_is_exclusive_and_says_how_to_keep_public_hosts() -> None:
    (problem,) = webhook_url_problems("https://hooks.example.com/notify", allowed_hosts=["127.0.0.1"])
    assert "'hooks.example.com' is not in WEBHOOK_ALLOWED_HOSTS" in problem and "add '*'" in problem


def test_the_any_public_entry_adds_internal_receivers_to_the_public_hosts() -> None:
    allowed = ["*", "127.0.0.1"]
    assert webhook_url_problems("https://hooks.example.com/notify", allowed_hosts=allowed) == []
    assert webhook_url_problems("http://127.0.0.1:8001/hooks", allowed_hosts=allowed) == []
    # Still nothing internal beyond what is listed: "*" means public hosts, not every host.
    assert webhook_url_problems("http://10.0.0.5/hook", allowed_hosts=allowed) != []
    assert webhook_url_problems("http://127.0.0.2/hook", allowed_hosts=allowed) != []
    assert webhook_url_problems("http://intranet/hook", allowed_hosts=allowed) != []
    assert address_problem("10.0.0.5", "hooks.example.com", allowed_hosts=allowed) is not None
    assert address_problem("93.184.216.34", "hooks.example.com", allowed_hosts=allowed) is None
