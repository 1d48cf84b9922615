"""The rate limiter's pacing, the circuit breaker's state machine and the start pacer, with explicit times."""

from __future__ import annotations

import bisect
import itertools

from notifications_retry.engine.flow_control import (
    MAX_PACE_DELAY,
    MAX_PACE_SPACING,
    PACE_MARGIN,
    CircuitBreaker,
    RateLimiter,
    StartPacer,
)


def max_in_window(times: list[float], window: float = 1.0) -> int:
    times = sorted(times)
    return max(bisect.bisect_left(times, t + window, lo=i) - i for i, t in enumerate(times))


def drive(limiter: RateLimiter, arrivals: list[float], step: float = 0.001) -> list[float]:
    """Start each send at the first tick of ``step`` at or after its arrival when the limiter allows."""
    starts: list[float] = []
    now = 0.0
    for arrival in arrivals:
        now = max(now, arrival)
        while not limiter.ready(now):
            now += step
        limiter.take(now)
        starts.append(now)
    return starts


def test_unlimited_limiter_never_waits():
    limiter = RateLimiter(None)
    assert not limiter.limited
    assert limiter.ready(0.0) and limiter.wait_time(0.0) == 0
    assert limiter.available_within(0.0, 0.25) > 10**6


def test_sends_are_paced_and_no_window_exceeds_the_rate():
    limiter = RateLimiter(20)
    starts = drive(limiter, [0.0] * 100)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.05 - 1e-9
    assert max_in_window(starts) <= 20


def test_an_idle_channel_does_not_burst_to_catch_up():
    limiter = RateLimiter(10)
    starts = drive(limiter, [0.0] * 5 + [10.0] * 30)
    assert max_in_window([s for s in starts if s >= 10.0]) <= 10
    # The first send after the pause starts at once; the next one a full interval later.
    later = [s for s in starts if s >= 10.0]
    assert later[0] == 10.0 and later[1] >= 10.1 - 1e-9


def test_available_within_counts_the_starts_inside_the_horizon():
    limiter = RateLimiter(10)
    assert limiter.available_within(0.0, 0.25) == 3  # at 0.0, 0.1, 0.2
    limiter.take(0.0)
    assert limiter.available_within(0.0, 0.25) == 2
    assert limiter.wait_time(0.0) == 0.1 and not limiter.ready(0.05)
    assert limiter.available_within(0.0, 0.05) == 0


def test_breaker_opens_after_threshold_consecutive_failures():
    changes: list[tuple[str, str]] = []
    breaker = CircuitBreaker(3, 10.0, on_change=lambda old, new: changes.append((old, new)))
    assert breaker.failure(0.0) is None and breaker.failure(0.1) is None
    assert breaker.capacity(0.1, 50) == 50
    assert breaker.failure(0.2) == "open"
    assert breaker.is_open and changes == [("closed", "open")]
    assert breaker.capacity(5.0, 50) == 0


def test_a_success_resets_the_consecutive_count():
    breaker = CircuitBreaker(3, 10.0)
    breaker.failure(0.0)
    breaker.failure(0.1)
    assert breaker.success() is None  # closed stays closed: no change
    breaker.failure(0.2)
    breaker.failure(0.3)
    assert breaker.state == "closed"


def test_after_cooldown_one_probe_then_closed_on_success():
    changes: list[tuple[str, str]] = []
    breaker = CircuitBreaker(1, 10.0, on_change=lambda old, new: changes.append((old, new)))
    breaker.failure(0.0)
    assert breaker.capacity(9.9, 50) == 0
    assert breaker.capacity(10.0, 50) == 1
    assert breaker.state == "half_open"
    # Claimed but not started: still the only probe.
    assert breaker.capacity(10.0, 50, queued=1) == 0
    breaker.started()
    assert breaker.capacity(10.1, 50) == 0
    assert breaker.success() == "closed"
    assert breaker.capacity(10.2, 50) == 50
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_failed_probe_reopens_for_another_cooldown():
    breaker = CircuitBreaker(5, 10.0)
    for i in range(5):
        breaker.failure(float(i))
    assert breaker.capacity(14.0, 50) == 1
    breaker.started()
    assert breaker.failure(14.5) == "open"
    assert breaker.capacity(24.0, 50) == 0
    assert breaker.capacity(24.5, 50) == 1


def test_a_permanent_error_on_the_probe_frees_the_probe_slot():
    breaker = CircuitBreaker(1, 1.0)
    breaker.failure(0.0)
    assert breaker.capacity(1.0, 5) == 1
    breaker.started()
    breaker.neutral()
    assert breaker.state == "half_open"
    assert breaker.capacity(1.1, 5) == 1


# -- the start pacer ----------------------------------------------------------------------------------


def test_a_pacer_delays_nothing_until_a_call_has_taken_time():
    pacer = StartPacer()
    assert [pacer.delay(0.0, 32) for _ in range(50)] == [0.0] * 50


def test_a_burst_of_starts_is_spread_over_the_calls_mean_duration():
    pacer = StartPacer()
    pacer.observe(0.020)
    spacing = 0.020 / 32 / PACE_MARGIN
    delays = [pacer.delay(1.0, 32) for _ in range(32)]
    assert delays[0] == 0.0
    assert all(abs(b - a - spacing) < 1e-9 for a, b in itertools.pairwise(delays))
    assert delays[-1] < 0.020, "the whole burst starts within one call's time"


def test_starts_already_spread_are_not_delayed():
    pacer = StartPacer()
    pacer.observe(0.020)
    spacing = 0.020 / 32 / PACE_MARGIN
    now, delays = 1.0, []
    for _ in range(100):
        delays.append(pacer.delay(now, 32))
        now += spacing * 1.01
    assert delays == [0.0] * 100


def test_no_start_waits_longer_than_the_longest_pace_delay():
    pacer = StartPacer()
    pacer.observe(0.030)
    delays = [pacer.delay(0.0, 16) for _ in range(500)]
    assert max(delays) <= MAX_PACE_DELAY + 1e-12
    assert delays[-1] == MAX_PACE_DELAY


def test_a_slow_providers_starts_are_not_spaced():
    # Spaced further apart than MAX_PACE_SPACING, answers never wait on the loop for one another.
    pacer = StartPacer()
    pacer.observe(2.0)
    assert 2.0 / 32 / PACE_MARGIN > MAX_PACE_SPACING
    assert [pacer.delay(0.0, 32) for _ in range(10)] == [0.0] * 10


def test_the_pace_follows_calls_that_get_faster():
    pacer = StartPacer()
    pacer.observe(1.0)
    for _ in range(200):
        pacer.observe(0.010)
    assert abs(pacer.mean_call - 0.010) < 0.001
    assert pacer.delay(0.0, 10) == 0.0 and 0 < pacer.delay(0.0, 10) < 0.001
