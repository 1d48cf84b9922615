"""Backoff, and the rounds a record's lease is sized by, as pure functions: the clock and randomness
are parameters.

:func:`exponential_delay` is the one doubling-with-a-cap rule: a record's retries (:class:`BackoffPolicy`),
a worker whose database is down, a commit that waits for it, the relay and the ``http`` publisher all
wait by it. :func:`retry_after_seconds` is the one reading of a ``Retry-After`` header (the providers'
and the ``http`` publisher's).

The rounds a lease and a claim are sized by are here too (:data:`LEASED_ROUNDS`, :data:`QUEUE_ROUNDS`,
:data:`RATE_HORIZON_SECONDS`): a channel's own backoff and lease are its model's methods
(``ChannelConfig.backoff_policy``, ``ChannelConfig.lease_seconds``), which the worker's claims and the
monolith's own sends both ask, so a record waits and is leased alike whoever sends it.
"""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

FIXED = "fixed"
#: The shortest wait after an answer with Retry-After (a "Retry-After: 0" still waits this long): a
#: retry is never immediate, or a burst of "Retry-After: 0" answers would come back at once, a burst.
MIN_RETRY_AFTER_SECONDS = 1.0
#: The longest wait before a next attempt, whatever the backoff or a provider's Retry-After says.
MAX_DELAY_SECONDS = 366 * 86_400
EXPONENTIAL = "exponential"
#: A Retry-After of more digits than this is past any maximum: clamped without being converted.
_MAX_DIGITS = 12
#: How far ahead a rate-limited channel may claim: records it can start within this many seconds.
RATE_HORIZON_SECONDS = 0.25
#: Rounds of a lane's max_concurrency a non-inline channel keeps claimed behind its calls in flight:
#: two, so a slot that frees up finds its next record waiting without a claim, and claims come in
#: rounds rather than half rounds (a claim costs the worker's thread the same whatever its size).
QUEUE_ROUNDS = 2
#: Rounds of waiting a lease covers before its record's call starts: one. A record still queued when
#: its lease could no longer cover its call is given back unsent
#: (``ChannelConfig.start_allowance_seconds``), so leases stay short, and the rows a crashed worker held
#: come back after two timeouts, not three.
LEASED_ROUNDS = 1
#: The random spread of each backoff delay (±10 %): enough that a burst of failures does not come back
#: as a burst, small enough that a delay stays close to the one the channel's backoff names.
JITTER_RATIO = 0.1


def exponential_delay(step: int, first: float, cap: float) -> float:
    """The wait before try ``step + 1`` after ``step`` failures: ``min(cap, first * 2 ** (step - 1))``."""
    if step < 1:
        raise ValueError(f"step must be >= 1 after a failure, got {step}")
    # Guard the exponent so a huge step count cannot overflow a float.
    return float(min(cap, first * 2.0 ** min(step - 1, 62)))


@dataclasses.dataclass(frozen=True)
class BackoffPolicy:
    """How long to wait before attempt ``attempts + 1``."""

    kind: str = EXPONENTIAL
    base_seconds: float = 60.0
    cap_seconds: float = 3600.0
    jitter_ratio: float = 0.1
    #: The longest wait after a provider's ``Retry-After``, its spread included (the worker's and the
    #: monolith's policies take ``RETRY_AFTER_MAX_SECONDS``; the default bounds it at a year).
    retry_after_max: float = MAX_DELAY_SECONDS

    def base_delay(self, attempts: int) -> float:
        """The delay before jitter: fixed, or ``min(cap, base * 2 ** (attempts - 1))``."""
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1 after a failed attempt, got {attempts}")
        if self.kind == FIXED:
            return min(self.cap_seconds, self.base_seconds)
        return exponential_delay(attempts, self.base_seconds, self.cap_seconds)

    def delay(self, attempts: int, rng: random.Random) -> float:
        """Base delay spread by +-jitter_ratio, so a burst of failures does not return as a burst."""
        base = self.base_delay(attempts)
        spread = base * self.jitter_ratio
        return max(0.0, base + rng.uniform(-spread, spread))


def next_attempt_at(
    attempts: int,
    now: datetime,
    rng: random.Random,
    policy: BackoffPolicy,
    retry_after: float | None = None,
) -> datetime:
    """When the next attempt is due: after the provider's ``Retry-After`` when it gave one, else the backoff.

    The provider's Retry-After (a 429, a 503) says when it will take the request: that time replaces the
    backoff's guess, spread upward by up to ``jitter_ratio`` (never before it, so a burst throttled
    together does not return together), never under ``MIN_RETRY_AFTER_SECONDS`` and never over
    ``policy.retry_after_max``, the spread included: a Retry-After clamped to that maximum waits exactly
    the maximum. docs/guarantees.md argues the choice, and what it costs the attempt budget.
    """
    if retry_after is not None:
        floor = max(MIN_RETRY_AFTER_SECONDS, retry_after)
        spread = floor * (1 + rng.uniform(0, policy.jitter_ratio))
        # The bound applies after the spread; the 1 s floor wins over a maximum set below it.
        delay = min(spread, max(MIN_RETRY_AFTER_SECONDS, policy.retry_after_max))
    else:
        delay = policy.delay(attempts, rng)
    # Whatever a provider asked for, the next attempt stays within a year: a datetime cannot hold
    # an absurd Retry-After, and an outcome must always be computable.
    return now + timedelta(seconds=min(delay, MAX_DELAY_SECONDS))


def retry_after_seconds(value: str | None, *, now: datetime, maximum: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); None if absent/bad.

    Clamped to ``[0, maximum]``: an absurd value (``999999999999``, a date in year 9999) waits the
    maximum and never raises. The one reading of the header, for providers and publishers alike.
    """
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value) if len(value) <= _MAX_DIGITS else math.inf
        return min(seconds, maximum)
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return min(max(0.0, seconds), maximum)
