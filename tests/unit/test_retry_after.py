"""``Retry-After`` parsing: seconds or HTTP-date, clamped to ``RETRY_AFTER_MAX_SECONDS``, never raising;
and the wait it gives, its spread included, bounded by the same setting."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifications_retry.conf import get_settings
from notifications_retry.exceptions import ProviderThrottled
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.http_status import parse_retry_after
from notifications_retry.providers.webhook import classify_response
from notifications_retry.rules.backoff import BackoffPolicy, next_attempt_at
from notifications_retry.rules.outcomes import RETRY, decide, failure_of

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


class HighestDraw(random.Random):
    """Every draw at the top of its range: the longest spread the jitter can give."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_retry_after_clamped_to_the_maximum_is_not_spread_past_it() -> None:
    policy = BackoffPolicy(jitter_ratio=0.1, retry_after_max=3600.0)
    # 3600 is what an absurd Retry-After (999999999999, a year-9999 date) is clamped to.
    assert next_attempt_at(1, NOW, HighestDraw(), policy, retry_after=3600.0) == NOW + timedelta(seconds=3600)
    # Below the maximum the spread stays, up to the maximum.
    assert next_attempt_at(1, NOW, HighestDraw(), policy, retry_after=100.0) == NOW + timedelta(seconds=110)
    assert next_attempt_at(1, NOW, HighestDraw(), policy, retry_after=3500.0) == NOW + timedelta(seconds=3600)
    # A maximum set under the 1 s floor: the floor wins, as for "Retry-After: 0".
    low = BackoffPolicy(jitter_ratio=0.1, retry_after_max=0.5)
    assert next_attempt_at(1, NOW, HighestDraw(), low, retry_after=0.5) == NOW + timedelta(seconds=1)


@pytest.mark.parametrize(("setting", "bound"), [(90, 90.0), (-1, 3600.0)])
def test_the_decision_on_a_clamped_throttle_waits_the_setting_at_most(
    settings: Any, setting: float, bound: float
) -> None:
    # The provider clamps the header; the channel's policy bounds the spread by the same setting
    # (an invalid one, which check E001 names, by the default).
    settings.NOTIFICATIONS_RETRY = {"RETRY_AFTER_MAX_SECONDS": setting}
    with pytest.raises(ProviderThrottled) as info:
        classify_response(429, {"retry-after": "999999999999"}, b"")
    channel = ChannelConfig(key="hooks", provider_key="webhook", max_attempts=5)
    decision = decide(
        failure_of(info.value),
        attempts=1,
        budget=5,
        now=NOW,
        policy=channel.backoff_policy(get_settings()),
        rng=HighestDraw(),
    )
    assert decision.result == RETRY
    assert decision.next_attempt_at == NOW + timedelta(seconds=bound)
