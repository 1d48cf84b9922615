"""The documented range of every numeric setting and channel field, in one place.

A value outside its range is refused everywhere it can enter: ``settings_problems`` (check E001) for
``NOTIFICATIONS_RETRY``, and for channels the model's validators, a database CHECK constraint and
check E006. The ranges are wide enough for any real deployment and narrow enough that no value can
overflow a column, an interval or a timer (a ``timeout_seconds`` of 1e13 once made every tick fail
with ``interval out of range``). This module imports nothing from Django, so ``conf`` and ``models``
can both read it.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Bound:
    """A closed range ``[low, high]``; ``low_open`` / ``high_open`` exclude an end."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: object) -> bool:
        """True for a number of the right kind inside the range (never for bool, NaN or infinity)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above_low = value > self.low if self.low_open else value >= self.low
        below_high = value < self.high if self.high_open else value <= self.high
        return above_low and below_high

    def describe(self) -> str:
        """The range in words, e.g. ``an integer from 1 to 100`` or ``a number > 0 and <= 300``."""
        kind = "an integer" if self.integer else "a number"
        if not self.low_open and not self.high_open:
            return f"{kind} from {_show(self.low)} to {_show(self.high)}"
        low = f"> {_show(self.low)}" if self.low_open else f">= {_show(self.low)}"
        high = f"< {_show(self.high)}" if self.high_open else f"<= {_show(self.high)}"
        return f"{kind} {low} and {high}"

    def problem(self, name: str, value: object) -> str | None:
        """``"NAME must be …, got value"`` when ``value`` is outside the range, else None."""
        if self.contains(value):
            return None
        return f"{name} must be {self.describe()}, got {value!r}"


def _show(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(number)


# --- NotificationEntity columns (the API refuses what the column would refuse) ----------------------

NOTIFICATION_TYPE_MAX_LENGTH = 64
CORRELATION_ID_MAX_LENGTH = 64
#: Not a column limit (``recipient`` is text): an address, phone number, user id or device token fits.
RECIPIENT_MAX_LENGTH = 4096
#: ``priority`` is a PostgreSQL smallint that Django keeps >= 0.
PRIORITY = Bound(0, 32767, integer=True)

# --- ChannelConfig fields (validators, CHECK constraints and check E006 all read these) ------------

MAX_ATTEMPTS = Bound(1, 100, integer=True)
BACKOFF_BASE_SECONDS = Bound(1, 86_400, integer=True)  # a day
BACKOFF_CAP_SECONDS = Bound(1, 2_592_000, integer=True)  # thirty days; also >= the base
TIMEOUT_SECONDS = Bound(0.001, 300)  # five minutes: the lease and the stop budget grow with it
RATE_LIMIT_PER_SECOND = Bound(0.001, 100_000)  # or NULL: no limit
MAX_CONCURRENCY = Bound(1, 512, integer=True)

CHANNEL_FIELDS: dict[str, Bound] = {
    "max_attempts": MAX_ATTEMPTS,
    "backoff_base_seconds": BACKOFF_BASE_SECONDS,
    "backoff_cap_seconds": BACKOFF_CAP_SECONDS,
    "timeout_seconds": TIMEOUT_SECONDS,
    "rate_limit_per_second": RATE_LIMIT_PER_SECOND,
    "max_concurrency": MAX_CONCURRENCY,
}

# --- NOTIFICATIONS_RETRY keys ---------------------------------------------------------------------

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
DEFAULT_MAX_PAYLOAD_DEPTH = 32

_DAY = 86_400
#: The largest RETRY_AFTER_MAX_SECONDS accepted: 30 days (a next attempt further out is a dead letter's job).
RETRY_AFTER_MAX_SECONDS_LIMIT = 30 * _DAY

SETTINGS: dict[str, Bound] = {
    "BATCH_SIZE": Bound(1, 1_000_000, integer=True),
    "MAX_DURATION_SECONDS": Bound(0, _DAY, low_open=True),
    "INTERVAL_SECONDS": Bound(0, _DAY, low_open=True),
    "LEASE_GRACE_SECONDS": Bound(0, 3_600),
    "RETRY_AFTER_MAX_SECONDS": Bound(0, RETRY_AFTER_MAX_SECONDS_LIMIT, low_open=True),
    "WORKER_MAX_IN_FLIGHT": Bound(1, 100_000, integer=True),
    "PARTITIONS": Bound(1, 1024, integer=True),
    "DEAD_LETTER_RETENTION_DAYS": Bound(1, 3_650, integer=True),
    "OUTBOX_RETENTION_DAYS": Bound(1, 3_650, integer=True),
    "MAX_PAYLOAD_BYTES": Bound(1_024, 16 * 1024 * 1024, integer=True),
    # Python's json and PostgreSQL's jsonb recurse per level: far below either's limit.
    "MAX_PAYLOAD_DEPTH": Bound(1, 256, integer=True),
}
#: The inner keys of the grouped settings (``conf.GROUPS``), each with its range.
CIRCUIT_BREAKER: dict[str, Bound] = {
    "failure_threshold": Bound(1, 10_000, integer=True),
    "cooldown_seconds": Bound(0, _DAY, low_open=True),
}
ENDPOINT_HEALTH: dict[str, Bound] = {
    # At least an hour of window (24 buckets of 150 s), at most 30 days.
    "window_seconds": Bound(3_600, 30 * _DAY, integer=True),
    "warn_ratio": Bound(0, 1, low_open=True),
    "disable_ratio": Bound(0, 1, low_open=True),
    "min_attempts": Bound(1, 1_000_000, integer=True),
    "reenable_cooldown_seconds": Bound(0, 30 * _DAY, integer=True),
}
GROUPS: dict[str, dict[str, Bound]] = {"CIRCUIT_BREAKER": CIRCUIT_BREAKER, "ENDPOINT_HEALTH": ENDPOINT_HEALTH}
#: ``METRICS_PORT`` (when not None) and every value of ``ATTEMPTS_BY_TYPE``.
METRICS_PORT = Bound(0, 65_535, integer=True)
#: ``SENT_RETENTION_DAYS`` when not None (None, the default, keeps Sent rows).
SENT_RETENTION_DAYS = Bound(1, 36_500, integer=True)
ATTEMPTS_BY_TYPE_VALUE = MAX_ATTEMPTS
