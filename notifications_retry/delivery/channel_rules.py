"""What a channel's configuration decides for each of its records: the backoff and the lease.

One home for both rules: the worker's claims (``engine.channels``) and the monolith's own sends
(:mod:`.handoff`) build them here, so a record waits and is leased alike whoever sends it.
"""

from __future__ import annotations

from notifications_retry.conf import RetrySettings, bounds
from notifications_retry.models import ChannelConfig
from notifications_retry.rules.backoff import BackoffPolicy

#: How far ahead a rate-limited channel may claim: records it can start within this many seconds.
RATE_HORIZON_SECONDS = 0.25
#: Rounds of a lane's max_concurrency a non-inline channel keeps claimed behind its calls in flight:
#: two, so a slot that frees up finds its next record waiting without a claim, and claims come in
#: rounds rather than half rounds (a claim costs the worker's thread the same whatever its size).
QUEUE_ROUNDS = 2
#: Rounds of waiting a lease covers before its record's call starts: one. A record still queued when
#: its lease could no longer cover its call is given back unsent (:func:`start_allowance_seconds`), so
#: leases stay short, and the rows a crashed worker held come back after two timeouts, not three.
LEASED_ROUNDS = 1
#: The random spread of each backoff delay (±10 %): enough that a burst of failures does not come back
#: as a burst, small enough that a delay stays close to the one the channel's backoff names.
JITTER_RATIO = 0.1


def backoff_policy(channel: ChannelConfig, conf: RetrySettings) -> BackoffPolicy:
    """The channel's retry backoff (``retry_backoff``, base, cap), spread by :data:`JITTER_RATIO`, and
    the longest wait a ``Retry-After`` gets (``RETRY_AFTER_MAX_SECONDS``, its spread included)."""
    retry_after_max = conf.RETRY_AFTER_MAX_SECONDS
    if not bounds.SETTINGS["RETRY_AFTER_MAX_SECONDS"].contains(retry_after_max):
        # Check E001 reports the value; an outcome must still be decided within a bound.
        retry_after_max = RetrySettings.RETRY_AFTER_MAX_SECONDS
    return BackoffPolicy(
        kind=channel.retry_backoff,
        base_seconds=float(channel.backoff_base_seconds),
        cap_seconds=float(channel.backoff_cap_seconds),
        jitter_ratio=JITTER_RATIO,
        retry_after_max=float(retry_after_max),
    )


def lease_seconds(
    channel: ChannelConfig, grace_seconds: float, *, fallback: ChannelConfig | None = None
) -> float:
    """How long a claim leases a record: a round of waiting ahead of it and its own call, plus a grace.

    With a ``fallback``, a call may be followed by the fallback's: the lease covers both, so a failover
    never outlives its record's lease (a late outcome would be discarded and the row sent again).
    ``grace_seconds`` is the ``LEASE_GRACE_SECONDS`` setting.
    """
    return (LEASED_ROUNDS + 1) * _call_seconds(channel, fallback) + RATE_HORIZON_SECONDS + grace_seconds


def start_allowance_seconds(
    channel: ChannelConfig, grace_seconds: float, *, fallback: ChannelConfig | None = None
) -> float:
    """How long after its claim a record's call may still start: the waiting its lease covers, and
    half the grace. The lease then still holds the call (and its fallback's) and the other half of the
    grace for the outcome's commit. Started later, the call could outlive the lease, and the row be
    claimed and sent by another worker meanwhile: such a record is given back unsent instead.
    """
    return LEASED_ROUNDS * _call_seconds(channel, fallback) + RATE_HORIZON_SECONDS + grace_seconds / 2


def _call_seconds(channel: ChannelConfig, fallback: ChannelConfig | None) -> float:
    """The longest a record's calls may take: the channel's timeout, and its fallback's after it."""
    timeout = float(channel.timeout_seconds)
    if fallback is not None:
        timeout += float(fallback.timeout_seconds)
    return timeout
