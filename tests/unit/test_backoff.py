"""The backoff policy is a pure function of attempts, clock and randomness."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from notifications_retry.engine.failures import BACKOFF_CAP_SECONDS, BACKOFF_FIRST_SECONDS, Backoff
from notifications_retry.rules.backoff import BackoffPolicy, exponential_delay, next_attempt_at

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempts", "expected"), [(1, 60), (2, 120), (3, 240), (6, 1920), (7, 3600), (50, 3600)]
)
def test_exponential_doubles_from_base_up_to_cap(attempts, expected):
    assert BackoffPolicy("exponential", 60, 3600).base_delay(attempts) == expected


def test_fixed_is_constant():
    policy = BackoffPolicy("fixed", 30, 3600)
    assert {policy.base_delay(n) for n in range(1, 10)} == {30}


def test_huge_attempt_counts_do_not_overflow():
    assert BackoffPolicy("exponential", 60, 3600).base_delay(10_000) == 3600


def test_jitter_stays_in_band_and_spreads():
    policy = BackoffPolicy("exponential", 60, 3600, jitter_ratio=0.1)
    rng = random.Random(1)
    delays = [policy.delay(3, rng) for _ in range(500)]
    assert min(delays) >= 216 and max(delays) <= 264
    assert len({round(d, 3) for d in delays}) > 400


def test_same_seed_same_schedule():
    policy = BackoffPolicy()
    a = [next_attempt_at(n, NOW, random.Random(5), policy) for n in range(1, 5)]
    b = [next_attempt_at(n, NOW, random.Random(5), policy) for n in range(1, 5)]
    assert a == b


def test_retry_after_replaces_the_backoff_longer_or_shorter():
    policy = BackoffPolicy("fixed", 10, 3600, jitter_ratio=0)
    assert next_attempt_at(1, NOW, random.Random(), policy, retry_after=120) == NOW + timedelta(seconds=120)
    assert next_attempt_at(1, NOW, random.Random(), policy, retry_after=2) == NOW + timedelta(seconds=2)


def test_retry_after_zero_still_waits_a_second():
    policy = BackoffPolicy(jitter_ratio=0)
    assert next_attempt_at(3, NOW, random.Random(), policy, retry_after=0) == NOW + timedelta(seconds=1)


def test_retry_after_is_spread_upward_only():
    policy = BackoffPolicy(jitter_ratio=0.1)
    waits = {
        (next_attempt_at(1, NOW, random.Random(seed), policy, retry_after=5) - NOW).total_seconds()
        for seed in range(200)
    }
    assert min(waits) >= 5 and max(waits) <= 5.5
    assert len(waits) > 100  # spread, so a burst throttled together does not come back together


def test_zero_attempts_is_a_clear_error():
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        BackoffPolicy().base_delay(0)


def test_exponential_delay_is_the_one_doubling_rule():
    assert [exponential_delay(step, 0.1, 2.0) for step in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert exponential_delay(10**9, 1.0, 30.0) == 30.0  # no float overflow on a huge count
    with pytest.raises(ValueError, match="step"):
        exponential_delay(0, 1.0, 30.0)


def test_every_backoff_of_the_app_follows_it():
    loop = Backoff(interval=0.5)
    pauses = [loop.pause(failed=True) for _ in range(8)]
    assert pauses == [exponential_delay(n, BACKOFF_FIRST_SECONDS, BACKOFF_CAP_SECONDS) for n in range(1, 9)]
    assert loop.pause(failed=False) == 0.5
