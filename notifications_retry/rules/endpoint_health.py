"""Endpoint health as one pure decision: a channel's window of attempts in, its next state out.

Nothing here reads the database, the clock or the settings: :mod:`notifications_retry.delivery.health`
gathers the counts and applies what :func:`assess` says. The states: ``ok``; ``warning`` once the share of
failed calls in the window reaches ``ENDPOINT_HEALTH["warn_ratio"]``; ``disabled`` once it reaches
``ENDPOINT_HEALTH["disable_ratio"]`` with at least ``ENDPOINT_HEALTH["min_attempts"]`` calls in the
window, or at once when the endpoint answers ``410 Gone`` (the Standard Webhooks spec: the receiver says
it will never want more).

With its circuit open, a channel makes one call (its breaker's probe) every
``CIRCUIT_BREAKER["cooldown_seconds"]`` however many rows wait: the window of an endpoint that fails every
call would fill to ``min_attempts`` only after about 20 minutes (50 calls, one every 30 s). So a probe
that fails once the circuit has been open (no success since it opened) for :data:`PROBING_SPAN_SECONDS` is
judged on the calls the breaker lets through in that time (:func:`probing_minimum`: 10 on defaults), when
that is fewer. A short outage, or one success, keeps the usual minimum.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from typing import Any

OK, WARNING, DISABLED = "ok", "warning", "disabled"
GONE = 410
#: Buckets per window: the window slides by a 24th of itself (an hour for the default day).
BUCKETS_PER_WINDOW = 24
#: A probe failing once the circuit has been open this long is judged on the calls its breaker lets
#: through in that time (the failures that opened it, then a probe per cool-down): on defaults, 5 calls
#: and 5 probes, so an endpoint that fails every call is judged 2.5 minutes after its circuit opened.
PROBING_SPAN_SECONDS = 150.0


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The health settings, read once by the caller."""

    warn_ratio: float
    disable_ratio: float
    min_attempts: int
    window_seconds: int
    cooldown_seconds: int
    #: Calls the window must hold at a probe failing after :data:`PROBING_SPAN_SECONDS` of open circuit
    #: (None: ``min_attempts``).
    probing_min_attempts: int | None = None

    @classmethod
    def of(cls, conf: Any) -> Thresholds:
        """From a :class:`~notifications_retry.conf.RetrySettings`."""
        health, breaker = conf.ENDPOINT_HEALTH, conf.CIRCUIT_BREAKER
        min_attempts = int(health.min_attempts)
        return cls(
            float(health.warn_ratio),
            float(health.disable_ratio),
            min_attempts,
            int(health.window_seconds),
            int(health.reenable_cooldown_seconds),
            probing_minimum(min_attempts, int(breaker.failure_threshold), float(breaker.cooldown_seconds)),
        )

    def needed(self, window: Window) -> int:
        """Calls ``window`` must hold before its ratio warns or disables."""
        if window.circuit_open_for >= PROBING_SPAN_SECONDS and self.probing_min_attempts is not None:
            return min(self.min_attempts, self.probing_min_attempts)
        return self.min_attempts

    @property
    def bucket_seconds(self) -> int:
        return max(1, self.window_seconds // BUCKETS_PER_WINDOW)


@dataclasses.dataclass(frozen=True)
class Window:
    """A channel's calls and failed calls in the window, whether one of the batch's answered 410 Gone,
    and, at a failed probe of its circuit breaker among them, how long (seconds) the circuit had been
    open with no success since (0.0: none)."""

    attempts: int
    failures: int
    gone: bool = False
    circuit_open_for: float = 0.0

    @property
    def ratio(self) -> float:
        return self.failures / self.attempts if self.attempts else 0.0


@dataclasses.dataclass(frozen=True)
class Transition:
    """A change of health state, with the reason recorded and announced."""

    state: str
    reason: str


def gone(status_code: int | None) -> bool:
    """Whether one answer disables its channel by itself, whatever the window holds: ``410 Gone``."""
    return status_code == GONE


def probing_minimum(min_attempts: int, circuit_threshold: int, circuit_cooldown: float) -> int:
    """Calls a window must hold to be judged at a probe failing after :data:`PROBING_SPAN_SECONDS` of open
    circuit: the ``circuit_threshold`` failures in a row that opened it, then one probe per
    ``circuit_cooldown`` in that span (one at least); never more than ``min_attempts``."""
    probes = math.ceil(PROBING_SPAN_SECONDS / circuit_cooldown) if circuit_cooldown > 0 else min_attempts
    return max(1, min(min_attempts, circuit_threshold + max(1, probes)))


def _span(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h" if not rest else f"{seconds // 60} min"


def assess(state: str, window: Window, limits: Thresholds) -> Transition | None:
    """The change ``window`` calls for on a channel in ``state``, or None to stay.

    A disabled channel stays disabled (only an operator re-enables it). Below ``min_attempts`` (fewer
    at a probe failing after a long open circuit: :meth:`Thresholds.needed`) the ratio says too little
    to disable or warn on, except that a warning clears once failures fall back under the warning ratio.
    """
    if state == DISABLED:
        return None
    if window.gone:
        return Transition(DISABLED, "the endpoint answered 410 Gone: it asks never to be called again")
    ratio = window.ratio
    needed = limits.needed(window)
    described = (
        f"{window.failures} of {window.attempts} calls failed ({ratio:.0%}) in the last "
        f"{_span(limits.window_seconds)}"
    )
    if needed <= window.attempts < limits.min_attempts:
        described += (
            f", its circuit open for {window.circuit_open_for / 60:.1f} min (judged from {needed} calls)"
        )
    enough = window.attempts >= needed
    disable = f"ENDPOINT_HEALTH['disable_ratio'] {limits.disable_ratio:.0%}"
    warn = f"ENDPOINT_HEALTH['warn_ratio'] {limits.warn_ratio:.0%}"
    if enough and ratio >= limits.disable_ratio:
        return Transition(DISABLED, f"{described}: at or past {disable}")
    if enough and ratio >= limits.warn_ratio and state == OK:
        return Transition(WARNING, f"{described}: at or past {warn}")
    if state == WARNING and ratio < limits.warn_ratio:
        return Transition(OK, f"{described}: back under {warn}")
    return None


def bucket_start(now: datetime, limits: Thresholds) -> datetime:
    """The start of the bucket ``now`` falls in (buckets are aligned on the Unix epoch)."""
    size = limits.bucket_seconds
    epoch = now.timestamp()
    return now - timedelta(seconds=epoch - (epoch // size) * size)


def reenable_wait(disabled_at: datetime | None, now: datetime, limits: Thresholds) -> float:
    """Seconds until an automatically disabled channel may be re-enabled (0: now)."""
    if disabled_at is None:
        return 0.0
    return max(0.0, (disabled_at + timedelta(seconds=limits.cooldown_seconds) - now).total_seconds())
