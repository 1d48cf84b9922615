"""What a channel's configuration decides for each of its records: the backoff and the lease.

One home for both rules: the worker's claims (``engine.channels``) and the monolith's own sends
(:mod:`.handoff`) build them here, so a record waits and is leased alike whoever sends it.
"""

from __future__ import annotations

from notifications_retry.models import ChannelConfig
from notifications_retry.retry import BackoffPolicy

#: How far ahead a rate-limited channel may claim: records it can start within this many seconds.
RATE_HORIZON_SECONDS = 0.25
#: Rounds of a lane's max_concurrency a non-inline channel keeps claimed behind its calls in flight:
#: one, so a slot that frees up finds its next record waiting without a claim, while a crash strands
#: at most one round of unstarted rows (and leases stay short).
QUEUE_ROUNDS = 1


def backoff_policy(channel: ChannelConfig, jitter_ratio: float) -> BackoffPolicy:
    """The channel's retry backoff (``retry_backoff``, base, cap), spread by the ``JITTER_RATIO`` setting."""
    return BackoffPolicy(
        kind=channel.retry_backoff,
        base_seconds=float(channel.backoff_base_seconds),
        cap_seconds=float(channel.backoff_cap_seconds),
        jitter_ratio=jitter_ratio,
    )


def lease_seconds(
    channel: ChannelConfig, grace_seconds: float, *, fallback: ChannelConfig | None = None
) -> float:
    """How long a claim leases a record: the round queued ahead of it and its own call, plus a grace.

    With a ``fallback``, a call may be followed by the fallback's: the lease covers both, so a failover
    never outlives its record's lease (a late outcome would be discarded and the row sent again).
    ``grace_seconds`` is the ``LEASE_GRACE_SECONDS`` setting.
    """
    timeout = float(channel.timeout_seconds)
    if fallback is not None:
        timeout += float(fallback.timeout_seconds)
    return (QUEUE_ROUNDS + 1) * timeout + RATE_HORIZON_SECONDS + grace_seconds
