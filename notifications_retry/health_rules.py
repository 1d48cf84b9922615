"""Endpoint health as one pure decision: a channel's window of attempts in, its next state out.

Nothing here reads the database, the clock or the settings: :mod:`notifications_retry.delivery.health`
gathers the counts and applies what :func:`assess` says. The states: ``ok``; ``warning`` once the
share of failed calls in the window reaches ``HEALTH_WARN_RATIO``; ``disabled`` once it reaches
``HEALTH_DISABLE_RATIO`` with at least ``HEALTH_MIN_ATTEMPTS`` calls in the window, or at once when the
endpoint answers ``410 Gone`` (the Standard Webhooks spec: the receiver says it will never want more).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

OK, WARNING, DISABLED = "ok", "warning", "disabled"
GONE = 410
#: Buckets per window: the window slides by a 24th of itself (an hour for the default day).
BUCKETS_PER_WINDOW = 24


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The health settings, read once by the caller."""

    warn_ratio: float
    disable_ratio: float
    min_attempts: int
    window_seconds: int
    cooldown_seconds: int

    @classmethod
    def of(cls, conf: Any) -> Thresholds:
        """From a :class:`~notifications_retry.conf.RetrySettings`."""
        return cls(
            float(conf.HEALTH_WARN_RATIO),
            float(conf.HEALTH_DISABLE_RATIO),
            int(conf.HEALTH_MIN_ATTEMPTS),
            int(conf.HEALTH_WINDOW_SECONDS),
            int(conf.HEALTH_REENABLE_COOLDOWN_SECONDS),
        )

    @property
    def bucket_seconds(self) -> int:
        return max(1, self.window_seconds // BUCKETS_PER_WINDOW)


@dataclasses.dataclass(frozen=True)
class Window:
    """A channel's calls and failed calls in the window, and whether one of them answered 410 Gone."""

    attempts: int
    failures: int
    gone: bool = False

    @property
    def ratio(self) -> float:
        return self.failures / self.attempts if self.attempts else 0.0


@dataclasses.dataclass(frozen=True)
class Transition:
    """A change of health state, with the reason recorded and announced."""

    state: str
    reason: str


def _span(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h" if not rest else f"{seconds // 60} min"


def assess(state: str, window: Window, limits: Thresholds) -> Transition | None:
    """The change ``window`` calls for on a channel in ``state``, or None to stay.

    A disabled channel stays disabled (only an operator re-enables it). Below ``min_attempts`` the
    ratio says too little to disable or warn on, except that a warning clears once failures fall
    back under the warning ratio.
    """
    if state == DISABLED:
        return None
    if window.gone:
        return Transition(DISABLED, "the endpoint answered 410 Gone: it asks never to be called again")
    ratio = window.ratio
    described = (
        f"{window.failures} of {window.attempts} calls failed ({ratio:.0%}) in the last "
        f"{_span(limits.window_seconds)}"
    )
    enough = window.attempts >= limits.min_attempts
    if enough and ratio >= limits.disable_ratio:
        return Transition(
            DISABLED, f"{described}: at or past HEALTH_DISABLE_RATIO {limits.disable_ratio:.0%}"
        )
    if enough and ratio >= limits.warn_ratio and state == OK:
        return Transition(WARNING, f"{described}: at or past HEALTH_WARN_RATIO {limits.warn_ratio:.0%}")
    if state == WARNING and ratio < limits.warn_ratio:
        return Transition(OK, f"{described}: back under HEALTH_WARN_RATIO {limits.warn_ratio:.0%}")
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
