"""The helpers the admin relies on: recipient masking (the URL policy: tests/unit/test_url_policy.py)."""

from __future__ import annotations

import pytest

from notifications_retry.observability.masking import mask_recipient


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
