"""Due rows of an ``in_app`` channel, claimed by the worker's own claim: for tests of what follows it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due
from notifications_retry.models import NotificationEntity
from notifications_retry.rules.outcomes import ClaimedRecord
from tests.factories import ChannelFactory, NotificationFactory


def claimed_in_app(now: datetime, count: int, **fields: Any) -> list[ClaimedRecord]:
    """``count`` Failed rows due at ``now`` on a fresh ``in_app`` channel (``fields`` set on each), all
    claimed (and checked so)."""
    channel = ChannelFactory(key="in_app", max_attempts=5)
    rows = [
        NotificationFactory(
            channel=channel,
            status=NotificationEntity.Status.FAILED,
            attempts=1,
            next_attempt_at=now,
            **fields,
        )
        for _ in range(count)
    ]
    batch = claim_due(
        ClaimRequest(
            now,
            [ChannelClaim(channel.pk, count, 60.0)],
            total=count,
            budgets={channel.pk: (channel.max_attempts, channel.key)},
        )
    )
    assert {r.id for r in batch.records} == {r.pk for r in rows}
    return batch.records
