"""Per-channel flow control held by the worker: a sender-side rate limit and a circuit breaker."""

from __future__ import annotations

import math


class RateLimiter:
    """Paces sends ``1 / rate`` seconds apart, so no 1-second window holds more than ``ceil(rate)``."""

    def __init__(self, rate_per_second: float | None) -> None:
        self.interval = 1.0 / rate_per_second if rate_per_second else 0.0
        self.next_at = 0.0

    @property
    def limited(self) -> bool:
        return self.interval > 0

    def available_within(self, now: float, horizon: float) -> int:
        """How many sends may start between ``now`` and ``now + horizon``."""
        if not self.limited:
            return 1 << 30
        start = max(self.next_at, now)
        if start > now + horizon:
            return 0
        return int(math.floor((now + horizon - start) / self.interval)) + 1

    def ready(self, now: float) -> bool:
        return not self.limited or now >= self.next_at

    def take(self, now: float) -> None:
        """Record a send starting at ``now`` (call only when :meth:`ready`)."""
        if self.limited:
            self.next_at = max(self.next_at, now) + self.interval

    def wait_time(self, now: float) -> float:
        return max(0.0, self.next_at - now) if self.limited else 0.0


class CircuitBreaker:
    """Opens after ``threshold`` consecutive retriable failures; one probe after ``cooldown``."""

    CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"

    def __init__(self, threshold: int, cooldown: float) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.failures = 0
        self.state = self.CLOSED
        self.opened_at = 0.0
        self.probe_in_flight = False

    def capacity(self, now: float, wanted: int) -> int:
        """How many records may be taken now: all when closed, one probe when half open."""
        if self.state == self.OPEN:
            if now - self.opened_at < self.cooldown:
                return 0
            self.state = self.HALF_OPEN
            self.probe_in_flight = False
        if self.state == self.HALF_OPEN:
            return 0 if self.probe_in_flight else min(1, wanted)
        return wanted

    def started(self) -> None:
        if self.state == self.HALF_OPEN:
            self.probe_in_flight = True

    def success(self) -> str | None:
        """Record a success; returns the new state when it changed."""
        self.failures = 0
        if self.state != self.CLOSED:
            self.state, self.probe_in_flight = self.CLOSED, False
            return self.CLOSED
        return None

    def failure(self, now: float) -> str | None:
        """Record a retriable failure; returns the new state when it changed."""
        self.failures += 1
        if self.state == self.HALF_OPEN or (self.state == self.CLOSED and self.failures >= self.threshold):
            self.state, self.opened_at, self.probe_in_flight = self.OPEN, now, False
            return self.OPEN
        return None

    def neutral(self) -> None:
        """An outcome that says nothing about the provider's health (a permanent error)."""
        if self.state == self.HALF_OPEN:
            self.probe_in_flight = False
