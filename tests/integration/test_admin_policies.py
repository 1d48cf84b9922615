"""The helpers the admin relies on: recipient masking and the webhook URL policy (no database needed)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from notifications_retry.observability.masking import mask_recipient
from notifications_retry.url_policy import host_is_allowlisted, webhook_url_problems


@pytest.mark.parametrize(
    ("value", "masked"),
    [
        ("alice@example.com", "a***@e***.com"),
        ("+1 (555) 123-4567", "+*********67"),
        ("0612345678", "********78"),
        ("fcm:APA91bHPRgkF3JUikC4ENAHEeMrd41Zxv3hVZjC9KtT8", "fcm:***(48)"),
        ("https://hooks.example.com/t/abc?token=x", "https://hooks.example.com/***"),
        ("bob", "***"),
        ("", ""),
    ],
)
def test_mask_recipient(value: str, masked: str) -> None:
    assert mask_recipient(value) == masked
    if len(value) > 3:
        assert value not in mask_recipient(value)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://127.1/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://[::1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/",
        "http://192.168.1.1:8080/",
        "http://0.0.0.0/",
        "http://localhost/",
        "http://metadata.google.internal/",
        "http://intranet/",
        "gopher://hooks.example.com/",
        "file:///etc/passwd",
        "https://user:pass@hooks.example.com/",
        "",
    ],
)
def test_refused_webhook_urls(url: str) -> None:
    assert webhook_url_problems(url, allowed_hosts=()) != []


def test_public_urls_pass_and_allowlist_rules(settings: Any) -> None:
    assert webhook_url_problems("https://hooks.example.com/notify", allowed_hosts=()) == []
    assert webhook_url_problems("http://127.0.0.1:9000/hook", allowed_hosts=["127.0.0.1"]) == []
    assert webhook_url_problems("http://10.1.2.3/hook", allowed_hosts=["10.1.0.0/16"]) == []
    assert webhook_url_problems("http://10.2.0.1/hook", allowed_hosts=["10.1.0.0/16"]) != []
    assert webhook_url_problems("https://a.b.example.com/", allowed_hosts=[".example.com"]) == []
    assert webhook_url_problems("https://example.com.evil.org/", allowed_hosts=[".example.com"]) != []
    assert host_is_allowlisted("HOOKS.Example.COM.", ["hooks.example.com"])
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}
    assert webhook_url_problems("https://hooks.example.com/x") == []
    assert "not in WEBHOOK_ALLOWED_HOSTS" in webhook_url_problems("https://other.example.com/x")[0]


def test_optional_resolution_catches_names_pointing_inside() -> None:
    def resolver(host: str) -> list[Any]:
        return [ipaddress.ip_address("10.0.0.7")]

    assert webhook_url_problems("https://sneaky.example.com/", allowed_hosts=(), resolve=resolver) != []
    assert webhook_url_problems("https://sneaky.example.com/", allowed_hosts=()) == []
