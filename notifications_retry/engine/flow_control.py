"""Per-channel flow control held by the worker: a sender-side rate limit and a circuit breaker.

Both run on the worker's scheduling thread and use ``time.monotonic()`` seconds, never the
database clock: they pace and pause real calls, not due times.
"""

from __future__ import annotations

import math
from collections.abc import Callable


class RateLimiter:
    """A token bucket of one token refilled every ``1 / rate`` seconds: sends start evenly spaced.

    A bucket of one means no burst: a channel that was idle (or a worker loop that fell behind) never
    catches up by sending back to back, so no 1-second window holds more than ``ceil(rate)`` starts.
    """

    def __init__(self, rate_per_second: float | None) -> None:
        self.interval = 0.0
        self.next_at = 0.0
        self.set_rate(rate_per_second)

    def set_rate(self, rate_per_second: float | None) -> None:
        """Change the rate (``None``: no limit); a start already booked keeps its time."""
        self.interval = 1.0 / rate_per_second if rate_per_second else 0.0

    @property
    def limited(self) -> bool:
        """Whether the channel has a rate limit at all."""
        return self.interval > 0

    def available_within(self, now: float, horizon: float) -> int:
        """How many sends may start between ``now`` and ``now + horizon``."""
        if not self.limited:
            return 1 << 30
        start = max(self.next_at, now)
        if start > now + horizon:
            return 0
        return math.floor((now + horizon - start) / self.interval) + 1

    def ready(self, now: float) -> bool:
        """Whether a send may start at ``now``."""
        return not self.limited or now >= self.next_at

    def take(self, now: float) -> None:
        """Record a send starting at ``now`` (call only when :meth:`ready`)."""
        if self.limited:
            self.next_at = max(self.next_at, now) + self.interval

    def wait_time(self, now: float) -> float:
        """Seconds until the next send may start (0 when it may start now)."""
        return max(0.0, self.next_at - now) if self.limited else 0.0


#: Called with (old state, new state) whenever a breaker changes state.
StateListener = Callable[[str, str], None]


class CircuitBreaker:
    """Opens after ``threshold`` consecutive retriable failures; one probe after ``cooldown``.

    closed → open (threshold reached) → half open (cool-down over: one probe may be taken) →
    closed (the probe succeeded) or open again (it failed). ``on_change`` hears every transition,
    including the time-driven open → half open one, so a metric and a log event can follow it.
    """

    CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"

    def __init__(self, threshold: int, cooldown: float, *, on_change: StateListener | None = None) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.failures = 0
        self.state = self.CLOSED
        self.opened_at = 0.0
        self.probe_in_flight = False
        self.on_change = on_change

    def _set(self, state: str) -> str | None:
        old, self.state = self.state, state
        if old == state:
            return None
        if self.on_change is not None:
            self.on_change(old, state)
        return state

    @property
    def is_open(self) -> bool:
        """True while the channel must not be called (cool-down running)."""
        return self.state == self.OPEN

    def capacity(self, now: float, wanted: int, queued: int = 0) -> int:
        """How many records may be taken now: all when closed, one probe when half open, none when open.

        ``queued`` counts records already taken but not started: a probe waiting in the queue is the probe.
        """
        if self.state == self.OPEN:
            if now - self.opened_at < self.cooldown:
                return 0
            self.probe_in_flight = False
            self._set(self.HALF_OPEN)
        if self.state == self.HALF_OPEN:
            return 0 if self.probe_in_flight or queued else min(1, wanted)
        return wanted

    def started(self) -> None:
        """A call starts (in half open state, this is the probe)."""
        if self.state == self.HALF_OPEN:
            self.probe_in_flight = True

    def success(self) -> str | None:
        """Record a success; returns the new state when it changed."""
        self.failures = 0
        self.probe_in_flight = False
        return self._set(self.CLOSED)

    def failure(self, now: float) -> str | None:
        """Record a retriable failure; returns the new state when it changed."""
        self.failures += 1
        if self.state == self.HALF_OPEN or (self.state == self.CLOSED and self.failures >= self.threshold):
            self.opened_at, self.probe_in_flight = now, False
            return self._set(self.OPEN)
        return None

    def neutral(self) -> None:
        """An outcome that says nothing about the provider's health (a permanent error)."""
        if self.state == self.HALF_OPEN:
            self.probe_in_flight = False
