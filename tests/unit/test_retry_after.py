"""``Retry-After`` parsing: seconds or HTTP-date, clamped to ``RETRY_AFTER_MAX_SECONDS``, never raising."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from notifications_retry.exceptions import ProviderThrottled
from notifications_retry.providers.webhook import classify_response, parse_retry_after

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 60 ", 60.0),
        ("0", 0.0),
        ("999999999999", 3600.0),
        ("9" * 5000, 3600.0),  # longer than int() would even convert
        ("Thu, 01 Jan 2026 12:02:00 GMT", 120.0),
        ("Thu, 01 Jan 2026 11:00:00 GMT", 0.0),  # in the past: no wait
        ("Fri, 31 Dec 9999 23:59:59 GMT", 3600.0),
        ("Thu, 01 Jan 2026 12:01:00 +0000", 60.0),
        ("Thu, 01 Jan 2026 12:01:00", 60.0),  # no zone: taken as UTC
        ("Mon, 01 Jan 99999 00:00:00 GMT", None),
        ("Thu, 01 Jan 0000 00:00:00 GMT", 0.0),  # read as year 2000: in the past
        ("-5", None),
        ("1e9", None),
        ("1.5", None),
        ("²", None),  # str.isdigit() says yes; float() says no
        ("٣", None),  # an Arabic-Indic digit
        ("soon", None),
        ("", None),
        (None, None),
        ("\x00", None),
    ],
)
def test_absurd_values_are_clamped_or_ignored_never_raised(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW, maximum=3600.0) == expected


def test_the_maximum_comes_from_the_setting(settings: Any) -> None:
    assert parse_retry_after("999999") == 3600.0  # the default
    settings.NOTIFICATIONS_RETRY = {"RETRY_AFTER_MAX_SECONDS": 90}
    assert parse_retry_after("999999") == 90.0
    assert parse_retry_after("30") == 30.0


def test_an_invalid_setting_still_bounds_the_wait(settings: Any) -> None:
    settings.NOTIFICATIONS_RETRY = {"RETRY_AFTER_MAX_SECONDS": -1}  # check E001 names it
    assert parse_retry_after("999999") == 3600.0


def test_throttled_answer_carries_the_clamped_value() -> None:
    with pytest.raises(ProviderThrottled) as info:
        classify_response(429, {"retry-after": "999999999999"}, b"")
    assert info.value.retry_after == 3600.0
