"""The failure ratio behind the circuit breaker: a probe failing after the circuit has been open for
150 s is judged on the calls the breaker lets through, so an endpoint failing 97 % of its calls is
disabled within minutes on default settings.

The worker is the real one, against PostgreSQL and a real HTTP receiver on 127.0.0.1; only time is
simulated: between ticks both of the worker's clocks jump to when a looping worker would start its next
tick (its interval's end, or the moment its channel's circuit lets a probe through).
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest

from notifications_retry.conf import get_settings
from notifications_retry.engine.flow_control import CircuitBreaker
from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, ChannelHealthChange, NotificationEntity
from notifications_retry.rules.endpoint_health import Thresholds, Window, assess, probing_minimum
from notifications_retry.runtime.clock import ManualClock
from tests.conftest import allow_loopback
from tests.factories import ChannelFactory
from tests.support.due_rows import due_rows
from tests.support.http_server import RecordedRequest, Reply

LIMITS = Thresholds(
    warn_ratio=0.8,
    disable_ratio=0.95,
    min_attempts=50,
    window_seconds=86_400,
    cooldown_seconds=3600,
    probing_min_attempts=10,
)


# --- the pure rule ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (Window(30, 30), None),  # no failed probe among the batch's calls: min_attempts applies
        (Window(30, 30, circuit_open_for=149.0), None),  # open for less than PROBING_SPAN_SECONDS
        (Window(9, 9, circuit_open_for=150.0), None),  # long enough, but fewer calls than its minimum
        (Window(10, 10, circuit_open_for=150.0), "disabled"),
        (Window(10, 9, circuit_open_for=600.0), "warning"),  # 90 %: past the warning ratio only
        (Window(20, 19, circuit_open_for=150.0), "disabled"),
        (Window(50, 48), "disabled"),
    ],
)
def test_a_probe_failing_after_a_long_open_circuit_is_judged_on_fewer_calls(window, expected):
    transition = assess("ok", window, LIMITS)
    assert (transition.state if transition else None) == expected
    if transition is not None and window.attempts < LIMITS.min_attempts:
        assert "(judged from 10 calls)" in transition.reason and "its circuit open for" in transition.reason


def test_the_probing_minimum_follows_the_breakers_pace():
    assert probing_minimum(50, 5, 30.0) == 10  # defaults: 5 failures in a row, a probe every 30 s
    assert probing_minimum(50, 5, 10.0) == 20
    assert probing_minimum(50, 5, 1.0) == 50  # never more than min_attempts
    assert probing_minimum(50, 5, 600.0) == 6  # one probe at least
    assert probing_minimum(3, 5, 30.0) == 3
    assert probing_minimum(50, 5, 0.0) == 50
    defaults = Thresholds.of(get_settings())
    assert (defaults.min_attempts, defaults.probing_min_attempts) == (50, 10)


def test_the_breaker_says_how_long_its_circuit_has_been_open():
    breaker = CircuitBreaker(2, 30.0)
    assert breaker.open_for(5.0) == 0.0
    breaker.failure(1.0)
    breaker.failure(2.0)  # opens
    assert breaker.open_for(10.0) == 8.0
    assert breaker.capacity(32.0, 5) == 1  # half open: one probe
    breaker.started()
    breaker.failure(33.0)  # the probe failed: open again, still since 2.0
    assert breaker.open_for(40.0) == 38.0
    assert breaker.capacity(63.5, 5) == 1
    breaker.started()
    breaker.success()
    assert breaker.open_for(70.0) == 0.0


# --- on a real worker ---------------------------------------------------------------------------------------


class SimulatedTime:
    """The worker's wall clock and monotonic clock: real time passes during a tick, jumps between."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds
        self.clock.advance(seconds)


def failing_97_percent():
    """3 calls in 100 succeed, spread evenly: the 34th, the 67th, the 100th."""
    lock, count = threading.Lock(), [0]

    def answer(request: RecordedRequest) -> Reply:
        with lock:
            count[0] += 1
            n = count[0]
        return Reply(200, {"id": "m"}) if (3 * n) // 100 > (3 * (n - 1)) // 100 else Reply(500, "down")

    return answer


@pytest.mark.django_db
def test_an_endpoint_failing_97_percent_is_disabled_within_10_minutes_on_defaults(
    clock, webhook_server, settings
):
    settings.NOTIFICATIONS_RETRY = {}
    allow_loopback(settings)  # every other setting at its default: the breaker's, the health check's
    webhook_server.responder = failing_97_percent()
    channel = ChannelFactory(
        key="partner_hook", provider_key="webhook", options={"url": webhook_server.url}, max_attempts=5
    )
    due_rows(clock, channel, None, 300, ago=60)
    sim = SimulatedTime(clock)
    started = clock.now()
    worker = Worker(clock=clock, monotonic=sim.monotonic, rng=random.Random(7))
    try:
        while ChannelConfig.objects.filter(pk=channel.pk, is_enabled=True).exists():
            assert clock.now() - started < timedelta(minutes=15), (
                f"not disabled after {len(webhook_server.requests)} calls in 15 simulated minutes"
            )
            began = sim.monotonic()
            worker.tick()
            # The looping worker's next tick: its interval's end, or its channel's circuit reopening.
            now = sim.monotonic()
            reopen = [b for rt in worker.channels.runtimes.values() if (b := rt.blocked_until()) > now]
            sim.jump(max(0.001, min([began + worker.interval, *reopen]) - now))
    finally:
        worker.close()
    change = ChannelHealthChange.objects.get(channel=channel, state="disabled")
    took = change.created_at - started
    calls = len(webhook_server.requests)
    print(f"97 %-failing endpoint disabled after {took.total_seconds():.0f} s simulated, {calls} calls")
    assert took <= timedelta(minutes=10), f"disabled after {took} ({calls} calls)"
    assert "(judged from 10 calls)" in change.reason
    assert "disable_ratio" in change.reason
    assert calls == change.attempts, "no call after the disable"
    waiting = NotificationEntity.objects.filter(channel=channel, attempt_log=[]).count()
    assert waiting == 300 - calls, "the rows no call reached wait, untouched"
